//! Text helpers every layer uses: quoting a long reply or value in a message without growing it.

/// `text` cut to at most `max_bytes` bytes on a character boundary, with `…` appended when
/// something was cut (for error messages that quote a model's or a provider's reply).
pub fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_owned();
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_cuts_on_a_character_boundary() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc…");
        assert_eq!(truncate("aé", 2), "a…");
    }
}
