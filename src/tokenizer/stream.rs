//! Streaming decode: text out as tokens come, never half a character.

use super::{Tokenizer, TokenizerError};

/// Turns generated ids into text one token at a time. A byte-level token can end inside a
/// UTF-8 character (an emoji is often two or three tokens); the bytes of an incomplete
/// character are held until the token that completes it arrives, so every piece
/// [`push`](Self::push) returns is whole characters. Bytes that can never become valid
/// UTF-8 come out as U+FFFD, one per invalid sequence, exactly as
/// `String::from_utf8_lossy` of all the bytes would show them.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder over `tokenizer`; with `skip_special`, control tokens (`<|im_end|>`) add
    /// no text.
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special,
            pending: Vec::new(),
        }
    }

    /// Adds token `id` and returns the text that is now complete (possibly empty).
    ///
    /// # Errors
    /// [`TokenizerError::UnknownId`]; the decoder is unchanged then.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self.tokenizer.token_bytes(id)?;
        if !(self.skip_special && self.tokenizer.is_control(id)) {
            self.pending.extend_from_slice(bytes);
        }
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` was just checked.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // An invalid sequence: it can never complete.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: the held bytes of an unfinished character, as U+FFFD (empty when
    /// nothing is held). The decoder can be used again afterwards.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// A decoder over `tokenizer` that goes on from `held`, the bytes another decoder of the
    /// same stream still held ([`StreamDecoder::into_held`]): a stream whose decoder cannot
    /// stay borrowed between tokens (`llm::Scheduler` keeps many) is decoded piece by piece.
    pub fn resume(tokenizer: &'t Tokenizer, skip_special: bool, held: Vec<u8>) -> Self {
        StreamDecoder {
            tokenizer,
            skip_special,
            pending: held,
        }
    }

    /// The bytes held back, for [`StreamDecoder::resume`].
    pub fn into_held(self) -> Vec<u8> {
        self.pending
    }

    /// Bytes held back because they end inside a character (0 to 3).
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }
}
