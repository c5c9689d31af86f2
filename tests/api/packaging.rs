//! The container build: every directory outside `src/` that the binary embeds at compile time
//! (the migrations, the console's assets) is copied into the Dockerfile's build stage. No Docker
//! engine runs here, so this reads the Dockerfile instead of building it; a directory the build
//! would miss fails here rather than at someone's `docker build`.

use std::collections::BTreeSet;
use std::path::Path;

/// Top-level directories the sources embed: `include_bytes!`/`include_str!` paths (relative to
/// their file) and `sqlx::migrate!` paths (relative to the crate root).
fn embedded_dirs(root: &Path) -> BTreeSet<String> {
    let mut dirs = BTreeSet::new();
    let mut stack = vec![root.join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (macro_, relative_to_file) in [
                ("include_bytes!(", true),
                ("include_str!(", true),
                ("migrate!(", false),
            ] {
                for (at, _) in text.match_indices(macro_) {
                    let rest = &text[at + macro_.len()..];
                    let Some(start) = rest.find('"') else {
                        continue;
                    };
                    let Some(len) = rest[start + 1..].find('"') else {
                        continue;
                    };
                    let literal = &rest[start + 1..start + 1 + len];
                    let base = if relative_to_file {
                        path.parent().unwrap().to_path_buf()
                    } else {
                        root.to_path_buf()
                    };
                    let target = base.join(literal);
                    // Normalize `..` by hand (the file may not exist as a whole path: a prefix).
                    let mut parts: Vec<String> = Vec::new();
                    for c in target.components() {
                        match c {
                            std::path::Component::ParentDir => {
                                parts.pop();
                            }
                            std::path::Component::Normal(s) => {
                                parts.push(s.to_string_lossy().into_owned())
                            }
                            _ => {}
                        }
                    }
                    let root_parts = root
                        .components()
                        .filter(|c| matches!(c, std::path::Component::Normal(_)))
                        .count();
                    if let Some(top) = parts.get(root_parts) {
                        dirs.insert(top.clone());
                    }
                }
            }
        }
    }
    dirs
}

#[test]
fn the_dockerfile_copies_everything_the_binary_embeds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let copied: BTreeSet<String> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|src| src.trim_end_matches('/').to_owned())
        .collect();
    let embedded = embedded_dirs(root);
    assert!(
        embedded.contains("console") && embedded.contains("migrations"),
        "the scan finds what the sources embed: {embedded:?}"
    );
    for dir in std::iter::once("src".to_owned()).chain(embedded) {
        assert!(
            copied.contains(&dir),
            "the Dockerfile's build stage does not COPY `{dir}`, which the binary embeds \
             (copied: {copied:?})"
        );
    }
}
