//! The agents shipped with omicos, embedded so that the binary works from anywhere.

/// (file name, contents) of every built-in agent, in the order they are read.
pub const BUILTIN_AGENTS: &[(&str, &str)] = &[
    ("generalist.md", include_str!("../agents/generalist.md")),
    ("data_analyst.md", include_str!("../agents/data_analyst.md")),
    (
        "literature_scout.md",
        include_str!("../agents/literature_scout.md"),
    ),
    ("coder.md", include_str!("../agents/coder.md")),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A file added to `agents/` but not listed here would silently not ship.
    #[test]
    fn every_file_in_the_agents_directory_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = BUILTIN_AGENTS.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }
}
