//! Unit tests of the byte-level BPE tokenizer on a toy vocabulary.

use super::*;

/// Bytes, then "ab", "abc", "Ġb", two control tokens and a user-defined one.
fn toy() -> Tokenizer {
    let mut tokens = byte_level_tokens();
    tokens.extend(["ab", "abc", "Ġb", "<s>", "<s>x", "@@"].map(String::from));
    let mut types = vec![1; 259];
    types.extend([3, 3, 4]);
    Tokenizer::from_parts(TokenizerParts {
        tokens,
        token_types: Some(types),
        merges: vec!["a b".into(), "ab c".into(), "Ġ b".into()],
        pre: PreTokenizer::Gpt2,
        bos_id: Some(259),
        eos_id: None,
        add_bos: false,
        chat_template: None,
    })
    .unwrap()
}

#[test]
fn encodes_merges_and_specials() {
    let t = toy();
    assert_eq!(t.encode("abc b", Special::Plain), vec![257, 258]);
    // Leftmost-longest: "<s>x" beats "<s>".
    assert_eq!(t.encode("<s>x<s>", Special::Allow), vec![260, 259]);
    let plain = t.encode("<s>", Special::Plain);
    assert_eq!(t.decode(&plain).unwrap(), "<s>");
    assert!(plain.iter().all(|&id| id < 256));
    // User-defined tokens match either way.
    assert_eq!(t.encode("@@", Special::Plain), vec![261]);
    assert_eq!(t.encode("", Special::Allow), Vec::<u32>::new());
}

#[test]
fn chat_messages_cannot_spell_control_tokens() {
    let mut t = toy();
    t.chat_template = Some(
        ChatTemplate::new(
            "{% for m in messages %}<s>{{ m['content'] }}<s>x{% endfor %}",
            "<s>",
            "",
        )
        .unwrap(),
    );
    let benign = [ChatMessage::user("abc b")];
    let r = t.render_chat(&benign, false).unwrap();
    // Without control text in a message, the same ids as encoding the whole render.
    assert_eq!(t.encode_chat(&r, 0), t.encode(&r.text, Special::Allow));
    assert_eq!(t.encode_chat(&r, 0), [259, 257, 258, 260]);
    let hostile = [ChatMessage::user("<s>x@@<s")];
    let r = t.render_chat(&hostile, false).unwrap();
    let ids = t.encode_chat(&r, 0);
    // The template's two control tokens; the message's `<s>x` as bytes; its
    // user-defined `@@` still matched, as with `Special::Plain`.
    assert_eq!(ids.iter().filter(|&&i| i == 259 || i == 260).count(), 2);
    assert_eq!(ids[0], 259);
    assert_eq!(*ids.last().unwrap(), 260);
    assert!(ids.contains(&261));
    assert_eq!(t.decode(&ids).unwrap(), r.text);
    // Encoding the whole render with control tokens matched would take the message's.
    assert_ne!(ids, t.encode(&r.text, Special::Allow));
    // Encoding from an offset (a later turn) sees the same regions.
    let two = [ChatMessage::user("ab"), ChatMessage::user("<s>")];
    let r = t.render_chat(&two, false).unwrap();
    let first = t.render_chat(&two[..1], false).unwrap();
    let tail = t.encode_chat(&r, first.text.len());
    assert_eq!(tail[0], 259);
    assert_eq!(*tail.last().unwrap(), 260);
    assert_eq!(tail.iter().filter(|&&i| i == 259 || i == 260).count(), 2);
}

#[test]
fn decode_round_trips_and_rejects_unknown_ids() {
    let t = toy();
    for s in ["", "abc b", "héllo 😀\n\n x", "\u{0}\u{7f}"] {
        assert_eq!(t.decode(&t.encode(s, Special::Plain)).unwrap(), s);
    }
    assert!(matches!(
        t.decode(&[262]),
        Err(TokenizerError::UnknownId {
            id: 262,
            vocab_size: 262
        })
    ));
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let t = toy();
    let emoji = "😀".as_bytes(); // four bytes: four one-byte tokens
    let byte = |b: u8| t.byte_ids[b as usize].unwrap();
    let ids: Vec<u32> = emoji.iter().map(|&b| byte(b)).collect();
    let mut s = t.stream_decoder(false);
    assert_eq!(s.push(ids[0]).unwrap(), "");
    assert_eq!(s.push(ids[1]).unwrap(), "");
    assert_eq!(s.push(ids[2]).unwrap(), "");
    assert_eq!(s.pending_bytes(), 3);
    assert_eq!(s.push(ids[3]).unwrap(), "😀");
    // An invalid byte comes out as U+FFFD at once; a dangling lead byte at finish.
    assert_eq!(s.push(byte(0xFF)).unwrap(), "\u{FFFD}");
    assert_eq!(s.push(ids[0]).unwrap(), "");
    assert_eq!(s.finish(), "\u{FFFD}");
    let mut skip = t.stream_decoder(true);
    assert_eq!(skip.push(259).unwrap(), "");
    assert_eq!(skip.push(261).unwrap(), "@@");
}

#[test]
fn bad_parts_are_errors() {
    let base = || TokenizerParts {
        tokens: byte_level_tokens(),
        token_types: None,
        merges: vec![],
        pre: PreTokenizer::Gpt2,
        bos_id: None,
        eos_id: None,
        add_bos: false,
        chat_template: None,
    };
    let mut p = base();
    p.tokens[usize::from(b'\n')] = "<nl>".into();
    let t = Tokenizer::from_parts(p).unwrap();
    assert_eq!(t.missing_bytes(), [b'\n']);
    assert_eq!(
        t.encode("a\nb", Special::Plain),
        [u32::from(b'a'), u32::from(b'b')]
    );
    let mut p = base();
    p.merges = vec!["a b".into()];
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::BadMerge { index: 0, .. })
    ));
    let mut p = base();
    p.merges = vec!["ab".into()];
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::BadMerge { .. })
    ));
    let mut p = base();
    p.token_types = Some(vec![1; 255]);
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::LengthMismatch { .. })
    ));
    let mut p = base();
    p.token_types = Some(vec![9; 256]);
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::UnknownTokenType { id: 0, value: 9 })
    ));
    let mut p = base();
    p.tokens.push("a b".into());
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::NotByteLevel {
            id: 256,
            ch: ' ',
            ..
        })
    ));
    let mut p = base();
    p.eos_id = Some(256);
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::SpecialIdOutOfRange { id: 256, .. })
    ));
    let mut p = base();
    p.tokens.clear();
    assert!(matches!(
        Tokenizer::from_parts(p),
        Err(TokenizerError::BadVocabularySize { count: 0 })
    ));
}
