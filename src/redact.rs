//! Secrets out of what is shown: URLs with their passwords and token parameters replaced by
//! `***`, for log lines and error messages. A leaf: configuration, the store's connection and
//! every client that reports a URL use it.

/// `url` fit for a log line or an error message: a password in its user info and the value of
/// each query parameter that names a password, secret or token become `***`
/// (`postgres://pes:***@db:5432/pes`). Everything else (user, host, port, database) is kept,
/// because that is what an operator needs to see which database was meant.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..scheme_end]);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            out.push('@');
            out.push_str(host);
        }
        None => out.push_str(authority),
    }
    let (before_fragment, fragment) = match tail.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (tail, None),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if is_secret_name(k) => format!("{k}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
        }
        None => out.push_str(before_fragment),
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// `text` (an error message) with every URL in it passed through [`redact_url`]: HTTP clients
/// name the URL they failed on, password and token included.
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        let start = rest[..sep]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[sep..]
            .find(|c: char| {
                c.is_whitespace() || matches!(c, ')' | '(' | '"' | '\'' | '<' | '>' | '`')
            })
            .map_or(rest.len(), |i| sep + i);
        // Punctuation after a URL ends the sentence, not the URL (`connecting to <url>: …`).
        let after_scheme = rest[sep + 3..end].trim_end_matches([':', ',', '.', ';']);
        let end = sep + 3 + after_scheme.len();
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Whether a parameter's name says its value is a credential.
fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token", "auth", "key"]
        .iter()
        .any(|w| name.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_urls_keep_everything_but_the_secrets() {
        for (url, shown) in [
            (
                "postgres://pes:s3cret@db:5432/pes",
                "postgres://pes:***@db:5432/pes",
            ),
            (
                "postgresql://u:p@ss:w@rd@h/db?sslmode=require&password=x",
                "postgresql://u:***@h/db?sslmode=require&password=***",
            ),
            (
                "postgres://postgres@127.0.0.1:5432/x",
                "postgres://postgres@127.0.0.1:5432/x",
            ),
            (
                "postgres://h/db?user=u&PassWord=x#f",
                "postgres://h/db?user=u&PassWord=***#f",
            ),
            ("sqlite://pes-data/pes.db", "sqlite://pes-data/pes.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            (
                "https://k:v@mcp.example/x?token=t",
                "https://k:***@mcp.example/x?token=***",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        assert_eq!(
            redact_urls_in(
                "connecting to http://u:pw@h/mcp?token=t: error sending request for url \
                 (http://h/mcp?token=t), sqlite://x"
            ),
            "connecting to http://u:***@h/mcp?token=***: error sending request for url \
             (http://h/mcp?token=***), sqlite://x"
        );
    }
}
