//! The container build: every directory outside `src/` that the binary embeds at compile time
//! (the migrations, the console's assets) is copied into the Dockerfile's build stage; the image
//! runs as a numeric non-root user that owns its data folder, with a binary without debug info;
//! the compose file requires API keys and publishes on loopback. No Docker engine runs here, so
//! this reads the files instead of building them; a mistake fails here rather than at someone's
//! `docker build` (CI also runs hadolint on the Dockerfile).

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

/// The Dockerfile's run stage: the lines after its last `FROM`.
fn run_stage(dockerfile: &str) -> Vec<String> {
    let lines: Vec<&str> = dockerfile.lines().map(str::trim).collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    // Join continuation lines, so each instruction is one string.
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for l in &lines[last_from..] {
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        if open {
            out.last_mut().unwrap().push(' ');
            out.last_mut()
                .unwrap()
                .push_str(l.trim_end_matches('\\').trim());
        } else {
            out.push(l.trim_end_matches('\\').trim().to_owned());
        }
        open = l.ends_with('\\');
    }
    out
}

#[test]
fn the_image_runs_as_a_numeric_user_that_owns_its_data_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let stage = run_stage(&dockerfile);
    let find =
        |prefix: &str| -> Vec<&String> { stage.iter().filter(|l| l.starts_with(prefix)).collect() };
    let user = find("USER ");
    assert_eq!(user.len(), 1, "one USER in the run stage: {stage:?}");
    let user = user[0].trim_start_matches("USER ").trim();
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER is numeric and not root (a runtime cannot resolve a name; DL3066): {user}"
    );

    let env = find("ENV ")
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let url = env
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("PES_DATABASE_URL="))
        .expect("the image sets PES_DATABASE_URL");
    let db_file = url.strip_prefix("sqlite://").expect("SQLite by default");
    let data = Path::new(db_file)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        find("VOLUME ")
            .iter()
            .any(|v| v.contains(&format!("\"{data}\""))),
        "the database's folder {data} is the volume: {stage:?}"
    );
    // The folder exists in the image, owned by the service's user: a new named volume takes
    // that owner, so the service can write there.
    assert!(
        find("COPY ")
            .iter()
            .any(|c| c.contains(&format!("--chown={uid}"))
                && c.trim_end().ends_with(&format!(" {data}"))),
        "the run stage creates {data} owned by {uid}: {stage:?}"
    );
    assert!(
        env.contains("PES_BIND=0.0.0.0:8080"),
        "the image listens on every interface (so keys are needed): {env}"
    );
}

#[test]
fn the_image_binary_has_no_debug_info() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    // 200 MB of debug tables would put the image far over 100 MB.
    assert!(
        dockerfile.contains("CARGO_PROFILE_RELEASE_DEBUG=false")
            && dockerfile.contains("CARGO_PROFILE_RELEASE_STRIP=debuginfo"),
        "the image's build leaves the debug info out"
    );
}

#[test]
fn compose_requires_keys_and_publishes_on_loopback() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let compose = std::fs::read_to_string(root.join("docker-compose.yml")).unwrap();
    let setting = |name: &str| -> Option<String> {
        compose
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
    };
    let keys = setting("PES_API_KEYS").expect("compose sets PES_API_KEYS");
    assert!(
        keys.starts_with("${PES_API_KEYS:?"),
        "compose stops when no keys are given, instead of serving open: {keys}"
    );
    assert!(
        setting("PES_ALLOW_UNAUTHENTICATED").is_none(),
        "compose does not open the API"
    );
    let published: Vec<&str> = compose
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- \""))
        .filter(|l| l.ends_with(":8080\""))
        .collect();
    assert_eq!(
        published,
        ["127.0.0.1:8080:8080\""],
        "the API is published on the host's loopback only"
    );
}
