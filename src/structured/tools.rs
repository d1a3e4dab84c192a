//! Tool calls in a model's text: the format its chat template teaches it, and the parse of
//! a generated answer into text and calls.

use serde_json::Value;

/// How a model writes a tool call, as its chat template shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolFormat {
    /// Hermes-style: `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`, one
    /// block per call (Qwen2.5's templates, NousResearch Hermes).
    Hermes,
}

/// One call a model made: the function's name and its arguments as JSON text (an object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments: a JSON object's text.
    pub arguments: String,
}

/// A generated answer split into its text and its tool calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    /// The text outside the calls, trimmed (`None` when nothing is left).
    pub content: Option<String>,
    /// The calls, in order (empty: a plain answer).
    pub tool_calls: Vec<ToolCall>,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format `template` (a chat template's source) renders tool calls in, if it renders
    /// them in one dynrt reads.
    pub fn of_template(template: &str) -> Option<ToolFormat> {
        (template.contains(HERMES_OPEN) && template.contains("tools")).then_some(ToolFormat::Hermes)
    }

    /// The text that opens a call.
    pub fn open(self) -> &'static str {
        match self {
            ToolFormat::Hermes => HERMES_OPEN,
        }
    }

    /// What a call that is forced ([`crate::structured::Grammar::tool_call`]) reads:
    /// the text before the JSON and the text after it.
    pub fn call_frame(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Hermes => ("<tool_call>\n", "\n</tool_call>"),
        }
    }

    /// Splits `text` into the answer's text and its calls. A block that does not hold a
    /// call (`{"name": "...", "arguments": {...}}`, arguments as an object or as a JSON
    /// object's text) leaves the whole answer as text, as llama-server does. An answer that
    /// is nothing but such a call without the block's tags (small models write that) is a
    /// call too when it names one of `names`.
    pub fn parse(self, text: &str, names: &[String]) -> Answer {
        let plain = || Answer {
            content: Some(text.to_string()).filter(|t| !t.trim().is_empty()),
            tool_calls: Vec::new(),
        };
        let mut rest = text;
        let mut content = String::new();
        let mut calls = Vec::new();
        while let Some(at) = rest.find(HERMES_OPEN) {
            content.push_str(&rest[..at]);
            let inner = &rest[at + HERMES_OPEN.len()..];
            let (body, after) = match inner.find(HERMES_CLOSE) {
                Some(end) => (&inner[..end], &inner[end + HERMES_CLOSE.len()..]),
                // A call cut off by the end of the generation: its JSON may still be whole.
                None => (inner, ""),
            };
            match parse_call(body) {
                Some(call) => calls.push(call),
                None => return plain(),
            }
            rest = after;
        }
        if calls.is_empty() {
            return match parse_call(unfenced(text)) {
                Some(call) if names.contains(&call.name) => Answer {
                    content: None,
                    tool_calls: vec![call],
                },
                _ => plain(),
            };
        }
        content.push_str(rest);
        let content = content.trim();
        Answer {
            content: (!content.is_empty()).then(|| content.to_string()),
            tool_calls: calls,
        }
    }

    /// Bytes at the end of `text` that may be the start of a call's opening (held back
    /// while streaming text, until the next tokens tell).
    pub fn held(self, text: &str) -> usize {
        let open = self.open();
        (1..open.len().min(text.len() + 1))
            .rev()
            .find(|&n| {
                text.is_char_boundary(text.len() - n) && open.starts_with(&text[text.len() - n..])
            })
            .unwrap_or(0)
    }
}

/// `text` without a Markdown code fence around it (`` ```json `` ... `` ``` ``), which
/// small models put around a bare call.
fn unfenced(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let body = rest.split_once('\n').map_or("", |(_, b)| b);
    body.trim_end().strip_suffix("```").unwrap_or(body)
}

fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => {
            let inner: Value = serde_json::from_str(s).ok()?;
            inner.is_object().then(|| inner.to_string())?
        }
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_calls_are_split_from_the_text() {
        let f = ToolFormat::of_template("{% if tools %}<tool_call>{% endif %}").unwrap();
        let names = ["get_weather".to_string()];
        let a = f.parse(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &names,
        );
        assert_eq!(a.content, None);
        assert_eq!(
            a.tool_calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        let two = f.parse(
            "Let me look.\n<tool_call>{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call>\
             <tool_call>{\"name\":\"b\",\"arguments\":{}}",
            &names,
        );
        assert_eq!(two.content.as_deref(), Some("Let me look."));
        assert_eq!(two.tool_calls.len(), 2);
        assert_eq!(two.tool_calls[0].arguments, r#"{"x":1}"#);
        // A block that holds no call leaves the text as it is.
        let broken = "<tool_call>{\"name\": oops}</tool_call>";
        assert_eq!(f.parse(broken, &names).content.as_deref(), Some(broken));
        assert!(f.parse(broken, &names).tool_calls.is_empty());
        assert_eq!(f.parse("Paris.", &names).content.as_deref(), Some("Paris."));
        // A bare call of a known tool is a call; of another name it is text.
        let bare = " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n";
        assert_eq!(f.parse(bare, &names).tool_calls.len(), 1);
        assert!(f.parse(bare, &["other".into()]).tool_calls.is_empty());
        let fenced =
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n```";
        assert_eq!(
            f.parse(fenced, &names).tool_calls[0].arguments,
            r#"{"city":"Rome"}"#
        );
        assert!(f.parse("```\nnot json\n```", &names).tool_calls.is_empty());
        assert_eq!(ToolFormat::of_template("{{ messages }}"), None);
    }

    #[test]
    fn a_possible_opening_is_held_back() {
        let f = ToolFormat::Hermes;
        assert_eq!(f.held("hello <tool_c"), 7);
        assert_eq!(f.held("hello <"), 1);
        assert_eq!(f.held("hello"), 0);
        assert_eq!(f.held("é<"), 1);
    }
}
