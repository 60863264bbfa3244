//! The laptop token: `omicos up` makes one at first start, as Jupyter does,
//! in `<workspace>/.omicos/token` (0600), and the CLI reads it from there.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a workspace's token is.
pub fn path(workspace: &Path) -> PathBuf {
    workspace.join(".omicos").join("token")
}

/// A new random token: 32 bytes from the OS, hex.
pub fn generate() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// The workspace's token, made (0600) if there is none yet; true when it was made now.
pub fn ensure(workspace: &Path) -> std::io::Result<(String, bool)> {
    let p = path(workspace);
    if let Some(t) = read(workspace)? {
        return Ok((t, false));
    }
    std::fs::create_dir_all(p.parent().expect("token path has a parent"))?;
    let t = generate();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    match opts.open(&p) {
        Ok(mut f) => {
            f.write_all(t.as_bytes())?;
            f.write_all(b"\n")?;
            Ok((t, true))
        }
        // Another start made it in between: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok((read(workspace)?.unwrap_or_default(), false))
        }
        Err(e) => Err(e),
    }
}

/// The workspace's token, if it has one.
pub fn read(workspace: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path(workspace)) {
        Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim().to_owned())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
