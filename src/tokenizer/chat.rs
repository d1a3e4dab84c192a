//! The chat template stored in a GGUF (`tokenizer.chat_template`), rendered as Jinja.
//!
//! The template is the model's own (for SmolLM2 ChatML with a default system prompt), so
//! it is rendered rather than recognised: [minijinja](https://docs.rs/minijinja) with the
//! settings Hugging Face `transformers` renders chat templates with (`trim_blocks`,
//! `lstrip_blocks`, a `raise_exception` function, `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`). A render has a fuel budget, so a hostile template cannot
//! loop or allocate without bound.

use super::TokenizerError;
use minijinja::{syntax::SyntaxConfig, Environment, Error, ErrorKind, Value};
use std::collections::BTreeMap;

/// Work one render may do: about one unit per instruction and per 64 bytes of output
/// (minijinja's fuel). Real templates use a few thousand for a long chat.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `"system"`, `"user"` or `"assistant"` (the template decides what it accepts).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
}

/// A compiled-checked chat template with the special-token texts it may print.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

fn template_error(e: Error) -> TokenizerError {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        reason.push_str(": ");
        reason.push_str(&s.to_string());
        source = s.source();
    }
    TokenizerError::Template { reason }
}

impl ChatTemplate {
    /// A template from its Jinja `source`; `bos_token` and `eos_token` are the texts the
    /// template sees under those names.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] when the source does not compile.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, TokenizerError> {
        let t = ChatTemplate {
            source: source.into(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        };
        t.environment()?
            .template_from_str(&t.source)
            .map_err(template_error)?;
        Ok(t)
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn environment(&self) -> Result<Environment<'_>, TokenizerError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        Ok(env)
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// answer begins (for ChatML `<|im_start|>assistant\n`).
    ///
    /// # Errors
    /// [`TokenizerError::Template`]: a render error, `raise_exception`, or the fuel running
    /// out.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let env = self.environment()?;
        let template = env
            .template_from_str(&self.source)
            .map_err(template_error)?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from(BTreeMap::from([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ]))
            })
            .collect();
        let ctx = BTreeMap::from([
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ]);
        template.render(Value::from(ctx)).map_err(template_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gguf::CHATML_TEMPLATE as CHATML;

    #[test]
    fn renders_chatml_with_default_system_prompt() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let text = t.render(&[ChatMessage::user("Hi")], true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let own_system = t
            .render(
                &[ChatMessage::new("system", "S"), ChatMessage::user("U")],
                false,
            )
            .unwrap();
        assert_eq!(
            own_system,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        );
    }

    #[test]
    fn bad_templates_are_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TokenizerError::Template { .. })
        ));
        let raising = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = raising.render(&[], false).unwrap_err().to_string();
        assert!(e.contains("no system role"), "{e}");
        let endless = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        assert!(matches!(
            endless.render(&[], false),
            Err(TokenizerError::Template { .. })
        ));
    }
}
