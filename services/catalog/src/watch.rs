//! Reloading the catalog when its files change.
//!
//! Every source directory that exists is watched (agent directories flat,
//! skill roots recursively, since SKILL.md sits one level down). A source that
//! does not exist yet is covered by watching its nearest existing ancestor, so
//! that creating `<workspace>/.omicos/agents` later is noticed too; after each
//! reload the set of watches is brought up to date. Bursts of events (an editor
//! writes a temp file, renames it, touches it) are debounced into one reload.

use crate::catalog::{Catalog, RefreshReport};
use notify::{EventKind, RecursiveMode, Watcher};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Instant;

/// The file watcher could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch the catalog directories: {0}")]
pub struct WatchError(#[from] notify::Error);

type Callback = Box<dyn Fn(&RefreshReport) + Send + 'static>;

enum Msg {
    Event(notify::Result<notify::Event>),
    Stop,
}

/// A running watcher. Dropping it stops watching.
pub struct CatalogWatcher {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    reloads: Arc<AtomicU64>,
}

impl std::fmt::Debug for CatalogWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogWatcher")
            .field("reloads", &self.reloads())
            .finish()
    }
}

impl CatalogWatcher {
    pub(crate) fn start(catalog: Catalog, on_reload: Option<Callback>) -> Result<Self, WatchError> {
        let (tx, rx) = mpsc::channel();
        let events = tx.clone();
        let watcher = notify::recommended_watcher(move |res| {
            // The receiver is gone only while the watcher is being dropped.
            let _ = events.send(Msg::Event(res));
        })?;
        let reloads = Arc::new(AtomicU64::new(0));
        let mut state = State {
            watcher,
            watched: HashMap::new(),
            catalog,
        };
        state.sync();
        let counter = reloads.clone();
        let thread = std::thread::Builder::new()
            .name("omicos-catalog-watch".into())
            .spawn(move || state.run(rx, on_reload, counter))
            .map_err(|e| WatchError(notify::Error::io(e)))?;
        Ok(Self {
            tx,
            thread: Some(thread),
            reloads,
        })
    }

    /// How many reloads the watcher has done.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::SeqCst)
    }
}

impl Drop for CatalogWatcher {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct State {
    watcher: notify::RecommendedWatcher,
    watched: HashMap<PathBuf, RecursiveMode>,
    catalog: Catalog,
}

/// Under a steady stream of changes, reload at least this often.
const MAX_DELAY_FACTOR: u32 = 10;

impl State {
    /// The directories to watch: each source, or its nearest existing ancestor.
    fn wanted(&self) -> HashMap<PathBuf, RecursiveMode> {
        let cfg = self.catalog.config();
        let dirs = cfg
            .agent_dirs()
            .into_iter()
            .map(|(d, _)| (d, RecursiveMode::NonRecursive))
            .chain(
                cfg.skill_dirs()
                    .into_iter()
                    .map(|(d, _)| (d, RecursiveMode::Recursive)),
            );
        let mut out = HashMap::new();
        for (dir, mode) in dirs {
            if dir.is_dir() {
                // A recursive watch of a directory wins over a flat one of the same.
                let e = out.entry(dir).or_insert(mode);
                if mode == RecursiveMode::Recursive {
                    *e = mode;
                }
            } else if let Some(anc) = dir.ancestors().skip(1).find(|a| a.is_dir()) {
                out.entry(anc.to_path_buf())
                    .or_insert(RecursiveMode::NonRecursive);
            }
        }
        out
    }

    /// Brings the watches up to date; true when a directory is newly watched.
    fn sync(&mut self) -> bool {
        let mut added = false;
        let wanted = self.wanted();
        let stale: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|(p, m)| wanted.get(*p) != Some(m))
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            let _ = self.watcher.unwatch(&p);
            self.watched.remove(&p);
        }
        for (p, m) in wanted {
            if self.watched.contains_key(&p) {
                continue;
            }
            match self.watcher.watch(&p, m) {
                Ok(()) => {
                    self.watched.insert(p, m);
                    added = true;
                }
                Err(e) => {
                    tracing::warn!(target: "omicos_catalog", "cannot watch {}: {e}", p.display())
                }
            }
        }
        added
    }

    /// Whether a changed path can affect the catalog: inside a source, or an
    /// ancestor of one (the source's directory was created or removed).
    fn relevant(&self, path: &Path) -> bool {
        let cfg = self.catalog.config();
        cfg.watches(path)
            || cfg
                .agent_dirs()
                .iter()
                .map(|(d, _)| d)
                .chain(cfg.skill_dirs().iter().map(|(d, _)| d))
                .any(|d| d.starts_with(path))
    }

    fn is_change(&self, msg: &notify::Result<notify::Event>) -> bool {
        match msg {
            Ok(ev) => {
                !matches!(ev.kind, EventKind::Access(_))
                    && ev.paths.iter().any(|p| self.relevant(p))
            }
            // A lost event (queue overflow) may hide a change: reload to be sure.
            Err(_) => true,
        }
    }

    fn run(
        mut self,
        rx: mpsc::Receiver<Msg>,
        on_reload: Option<Callback>,
        reloads: Arc<AtomicU64>,
    ) {
        let debounce = self.catalog.config().watch_debounce;
        loop {
            match rx.recv() {
                Ok(Msg::Event(ev)) if self.is_change(&ev) => {}
                Ok(Msg::Event(_)) => continue,
                Ok(Msg::Stop) | Err(_) => return,
            }
            let first = Instant::now();
            loop {
                if first.elapsed() >= debounce * MAX_DELAY_FACTOR {
                    break;
                }
                match rx.recv_timeout(debounce) {
                    Ok(Msg::Event(_)) => continue,
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            let mut report = self.catalog.refresh();
            if self.sync() {
                // A directory that just appeared may have got files between
                // the reload and its watch: read once more so none is missed.
                report = self.catalog.refresh();
            }
            reloads.fetch_add(1, Ordering::SeqCst);
            tracing::info!(target: "omicos_catalog", agents = report.agents, skills = report.skills, "catalog reloaded after a file change");
            if let Some(cb) = &on_reload {
                cb(&report);
            }
        }
    }
}
