//! SSRF protection for `web_fetch`: the address rules live in `omicos-ssrf`
//! (shared with kernel_install); this adds the reqwest side.
//!
//! Two checks guard every request (the first one and every redirect):
//! the URL's host when it is an IP literal, in any spelling (reqwest never
//! calls the DNS resolver for literals), and every address a name resolves to,
//! in [`GuardedResolver`], which hands reqwest only the addresses it checked,
//! so a DNS answer cannot change between the check and the connection.

pub use omicos_ssrf::{
    BadAllowEntry, Blocked, Lookup, LookupFuture, Policy, SystemLookup, blocked_rule,
    parse_legacy_ipv4,
};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::{net::SocketAddr, sync::Arc};

/// A reqwest resolver that checks every address of a name and hands reqwest
/// exactly the checked addresses.
pub struct GuardedResolver {
    policy: Arc<Policy>,
    lookup: Arc<dyn Lookup>,
}

impl GuardedResolver {
    /// A resolver enforcing `policy` over `lookup`.
    pub fn new(policy: Arc<Policy>, lookup: Arc<dyn Lookup>) -> Self {
        Self { policy, lookup }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let lookup = self.lookup.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = lookup.lookup(&host).await?;
            if addrs.is_empty() {
                return Err(format!("{host} has no addresses").into());
            }
            policy.check_addrs(&host, &addrs)?;
            let checked: Addrs = Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(checked)
        })
    }
}
