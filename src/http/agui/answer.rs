//! The final answer's text as the model writes it: the synthesis phase streams the JSON of
//! `pes_synthesis` (`{"response": "…", "sources": […], …}`), and a person wants to read the
//! `response` string growing, not the JSON around it. [`AnswerText`] reads the deltas as they
//! come and gives back, decoded, the characters of the top-level `response` string they add.
//!
//! It never waits for more than it has: a delta may end inside an escape (`\u00`), which is kept
//! until the rest arrives. Only the first `response` value is read; what the answer finally is
//! comes from the `FINAL_RESPONSE` observation, which the fold compares with what was streamed.

/// Where the reader is in the JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A key of the top-level object (or its end).
    Key,
    /// The `:` after a key.
    Colon,
    /// A value of the top-level object.
    Value,
    /// A `,` or the end after a value.
    Next,
}

/// What the string being read is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Key,
    /// The `response` value: its characters are the answer.
    Answer,
    Other,
}

/// Reads the answer out of the streamed synthesis JSON.
#[derive(Debug, Clone)]
pub struct AnswerText {
    depth: u32,
    expect: Expect,
    in_string: bool,
    role: Role,
    /// The characters after a backslash, until the escape is complete.
    escape: Option<String>,
    /// A high surrogate waiting for its low half.
    high: Option<u16>,
    key: String,
    last_key: String,
    /// The `response` string has been read to its end.
    done: bool,
}

impl Default for AnswerText {
    fn default() -> Self {
        Self {
            depth: 0,
            expect: Expect::Key,
            in_string: false,
            role: Role::Other,
            escape: None,
            high: None,
            key: String::new(),
            last_key: String::new(),
            done: false,
        }
    }
}

impl AnswerText {
    /// Read `delta`; the answer text it adds (possibly empty).
    pub fn push(&mut self, delta: &str) -> String {
        let mut out = String::new();
        for c in delta.chars() {
            if self.in_string {
                self.string_char(c, &mut out);
            } else {
                self.structure_char(c);
            }
        }
        out
    }

    fn structure_char(&mut self, c: char) {
        let top = self.depth == 1;
        match c {
            '"' => {
                self.in_string = true;
                self.role = if top && self.expect == Expect::Key {
                    self.key.clear();
                    Role::Key
                } else if top
                    && self.expect == Expect::Value
                    && self.last_key == "response"
                    && !self.done
                {
                    Role::Answer
                } else {
                    Role::Other
                };
            }
            '{' | '[' => {
                self.depth += 1;
                if self.depth == 1 {
                    self.expect = Expect::Key;
                }
            }
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    self.expect = Expect::Next;
                }
            }
            ':' if top => self.expect = Expect::Value,
            ',' if top => self.expect = Expect::Key,
            c if top && self.expect == Expect::Value && !c.is_whitespace() => {
                // A number, `true`, `false` or `null`: the value has begun.
                self.expect = Expect::Next;
            }
            _ => {}
        }
    }

    fn string_char(&mut self, c: char, out: &mut String) {
        if let Some(mut escape) = self.escape.take() {
            escape.push(c);
            let complete = if escape.starts_with('u') {
                escape.len() == 5
            } else {
                true
            };
            if !complete {
                self.escape = Some(escape);
                return;
            }
            if let Some(decoded) = self.decode_escape(&escape) {
                self.take_char(decoded, out);
            }
            return;
        }
        match c {
            '\\' => self.escape = Some(String::new()),
            '"' => {
                self.in_string = false;
                match self.role {
                    Role::Key => {
                        self.last_key = std::mem::take(&mut self.key);
                        self.expect = Expect::Colon;
                    }
                    Role::Answer => {
                        self.done = true;
                        self.expect = Expect::Next;
                    }
                    Role::Other => {
                        if self.depth == 1 {
                            self.expect = Expect::Next;
                        }
                    }
                }
            }
            c => self.take_char(c, out),
        }
    }

    /// The character an escape stands for (`None` while half a surrogate pair is pending, or
    /// for an escape JSON does not have).
    fn decode_escape(&mut self, escape: &str) -> Option<char> {
        let simple = match escape {
            "n" => Some('\n'),
            "t" => Some('\t'),
            "r" => Some('\r'),
            "b" => Some('\u{8}'),
            "f" => Some('\u{c}'),
            "\"" => Some('"'),
            "\\" => Some('\\'),
            "/" => Some('/'),
            _ => None,
        };
        if simple.is_some() {
            self.high = None;
            return simple;
        }
        let unit = u16::from_str_radix(escape.strip_prefix('u')?, 16).ok()?;
        match (self.high.take(), unit) {
            (_, 0xD800..=0xDBFF) => {
                self.high = Some(unit);
                None
            }
            (Some(high), 0xDC00..=0xDFFF) => {
                let code =
                    0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                char::from_u32(code)
            }
            (_, 0xDC00..=0xDFFF) => Some(char::REPLACEMENT_CHARACTER),
            (_, unit) => char::from_u32(u32::from(unit)),
        }
    }

    fn take_char(&mut self, c: char, out: &mut String) {
        match self.role {
            Role::Key => self.key.push(c),
            Role::Answer => out.push(c),
            Role::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `json` in pieces of `n` characters; the answer read.
    fn read(json: &str, n: usize) -> String {
        let chars: Vec<char> = json.chars().collect();
        let mut reader = AnswerText::default();
        chars
            .chunks(n)
            .map(|piece| reader.push(&piece.iter().collect::<String>()))
            .collect()
    }

    #[test]
    fn the_response_string_is_read_whatever_the_pieces() {
        let json = r#"{"sources": [{"title": "response", "url": "x"}], "response": "Line \"one\"\n\u00e9 \ud83d\ude00 done\\", "suggestions": ["response"]}"#;
        let want = "Line \"one\"\n\u{e9} \u{1F600} done\\";
        for n in [1, 2, 3, 5, 7, 1000] {
            assert_eq!(read(json, n), want, "pieces of {n}");
        }
    }

    #[test]
    fn nothing_but_the_top_level_response_is_read() {
        assert_eq!(read(r#"{"a": {"response": "no"}, "b": 1}"#, 1), "");
        assert_eq!(read(r#"{"response": 3}"#, 1), "");
        // Fenced JSON reads the same.
        assert_eq!(read("```json\n{\"response\": \"yes\"}\n```", 4), "yes");
        // A second document (a retried reply) is not read again.
        assert_eq!(read(r#"{"response": "a"}{"response": "b"}"#, 2), "a");
    }
}
