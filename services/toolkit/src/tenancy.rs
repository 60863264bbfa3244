//! Tenants: each has its own workspace under the deployment's root
//! (`<root>/.omicos/tenants/<tenant>/`), its own memory scope and its own
//! kernels. The tenants live under the root's `.omicos/`, omicos's own state,
//! so that the root tenant's tools never see them: the sandbox hides
//! `.omicos/` from the root tenant's code and the file tools refuse it.
//! Workspaces of the earlier layout (`<root>/<tenant>/`, recognised by their
//! own `.omicos/`) are moved there on first use.
//!
//! The tenant comes from the principal the orchestrator authenticated; the
//! runner believes it only from an authenticated orchestrator and passes it
//! to providers as a name (`CallContext.tenant`), never as a path: each
//! provider joins it to the workspace *it* was configured with, so no caller
//! can name a workspace of its own choosing.
//!
//! The tenant `default` (the laptop's `local@default`, and any deployment
//! that names no tenants) works in the root itself, as before tenants existed.

use std::path::{Path, PathBuf};

/// The tenant whose workspace is the root itself.
pub const ROOT_TENANT: &str = "default";

/// Longest tenant name.
const MAX_TENANT_LEN: usize = 64;

/// Whether `tenant` works in the root (empty or [`ROOT_TENANT`]).
pub fn is_root(tenant: &str) -> bool {
    tenant.is_empty() || tenant == ROOT_TENANT
}

/// Checks a tenant name: one path component of letters, digits, `.`, `_`
/// and `-`, starting with a letter or digit, at most 64 bytes.
pub fn check_tenant(tenant: &str) -> Result<(), String> {
    let ok = !tenant.is_empty()
        && tenant.len() <= MAX_TENANT_LEN
        && tenant.as_bytes()[0].is_ascii_alphanumeric()
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the tenant `{}` is not a usable name (letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_TENANT_LEN} bytes)",
            tenant.escape_debug()
        ))
    }
}

/// Where the tenants' workspaces live under the root.
pub const TENANTS_DIR: &str = ".omicos/tenants";

/// The workspace directory of `tenant` under `root` (not created): the root
/// itself for the root tenant.
pub fn tenant_dir(root: &Path, tenant: &str) -> Result<PathBuf, String> {
    if is_root(tenant) {
        return Ok(root.to_path_buf());
    }
    check_tenant(tenant)?;
    Ok(root.join(TENANTS_DIR).join(tenant))
}

/// The workspace of `tenant` under `root`, created when missing.
pub fn tenant_workspace(root: &Path, tenant: &str) -> Result<PathBuf, String> {
    let ws = tenant_dir(root, tenant)?;
    if is_root(tenant) {
        return Ok(ws);
    }
    if !ws.exists() {
        migrate(root, tenant, &ws);
    }
    std::fs::create_dir_all(&ws)
        .map_err(|e| format!("cannot create the workspace of tenant `{tenant}`: {e}"))?;
    Ok(ws)
}

/// Moves a tenant workspace of the earlier layout (`<root>/<tenant>/` with
/// its own `.omicos/`) to where it lives now. A plain directory of the root
/// tenant that happens to bear the name is left alone.
fn migrate(root: &Path, tenant: &str, to: &Path) {
    let old = root.join(tenant);
    let is_workspace = std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir())
        && std::fs::symlink_metadata(old.join(".omicos")).is_ok_and(|m| m.is_dir());
    if !is_workspace {
        return;
    }
    let moved = to
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::rename(&old, to));
    match moved {
        Ok(()) => tracing::warn!(
            tenant,
            from = %old.display(),
            to = %to.display(),
            "moved a tenant workspace of the earlier layout out of the root tenant's view"
        ),
        Err(e) => tracing::error!(
            tenant,
            from = %old.display(),
            error = %e,
            "cannot move a tenant workspace of the earlier layout; it stays visible to the root tenant"
        ),
    }
}

/// The memory scope `scope` of `tenant`: the scope itself for the root
/// tenant, `<tenant>/<scope>` otherwise (a tenant name has no `/`, so two
/// tenants never share one).
pub fn tenant_scope(scope: &str, tenant: &str) -> String {
    if is_root(tenant) {
        scope.to_owned()
    } else {
        format!("{tenant}/{scope}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_get_their_own_directory_and_scope() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(tenant_workspace(root.path(), "").unwrap(), root.path());
        assert_eq!(
            tenant_workspace(root.path(), "default").unwrap(),
            root.path()
        );
        let acme = tenant_workspace(root.path(), "acme").unwrap();
        assert_eq!(acme, root.path().join(".omicos/tenants/acme"));
        assert!(acme.is_dir());
        // A workspace of the earlier layout moves, with its files; a plain
        // directory of the root tenant that bears a tenant's name stays.
        std::fs::create_dir_all(root.path().join("globex/.omicos")).unwrap();
        std::fs::write(root.path().join("globex/notes.txt"), "g").unwrap();
        std::fs::create_dir_all(root.path().join("initech")).unwrap();
        let globex = tenant_workspace(root.path(), "globex").unwrap();
        assert_eq!(
            std::fs::read_to_string(globex.join("notes.txt")).unwrap(),
            "g"
        );
        assert!(!root.path().join("globex").exists());
        tenant_workspace(root.path(), "initech").unwrap();
        assert!(root.path().join("initech").is_dir());
        for bad in [
            "..",
            ".",
            "../evil",
            "a/b",
            "/etc",
            "a\\b",
            "-x",
            "x y",
            &"a".repeat(65),
        ] {
            assert!(tenant_workspace(root.path(), bad).is_err(), "{bad}");
        }
        assert_eq!(tenant_scope("workspace", "default"), "workspace");
        assert_eq!(tenant_scope("workspace", "acme"), "acme/workspace");
    }
}
