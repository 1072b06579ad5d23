//! Text from outside the agent (a file's path, a parser's or an archive's error) made fit for
//! a one-line message: a status condition, an Event, the journal, a refusal on stderr.

/// How long such a message may grow.
const MAX_MESSAGE: usize = 400;

/// `text` with its control characters escaped (a newline in it cannot start a line of its
/// own in a log or a status), cut at [`MAX_MESSAGE`] bytes.
pub fn one_line(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let piece: String = if c.is_control() {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        if out.len() + piece.len() > MAX_MESSAGE {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn control_characters_are_escaped_and_length_bounded() {
        assert_eq!(one_line("a\nb\tc\u{1}"), "a\\nb\\tc\\u{1}");
        assert_eq!(
            one_line("/etc/flexnode/kubeconfig"),
            "/etc/flexnode/kubeconfig"
        );
        assert_eq!(one_line(&"x".repeat(1000)).len(), 400 + '…'.len_utf8());
    }
}
