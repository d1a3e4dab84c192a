//! The byte automaton of a [`Grammar`]: a set of stacks of frames (a pushdown automaton,
//! nondeterministic where `anyOf`, optional properties or literals sharing a start leave the
//! choice open), advanced one byte at a time. Everything it accepts is valid UTF-8 JSON of
//! the grammar with whitespace only between tokens (nothing, one space, or one newline and at
//! most [`MAX_WS`] spaces of indentation, as in llama.cpp's JSON grammar but without tabs: a
//! sampled small model spends a token per tab), no
//! leading or trailing whitespace, numbers of at most [`MAX_DIGITS`] digits per part and
//! nesting at most [`MAX_DEPTH`] deep, so a generation cannot pad forever.

use super::schema::{Grammar, Node, NodeId, ANY_ARRAY, ANY_LITERAL, ANY_NUMBER, ANY_OBJECT};
use super::schema::{ANY, ANY_STRING, UNBOUNDED};

/// Deepest nesting of frames (objects, arrays, strings inside them).
pub const MAX_DEPTH: usize = 48;
/// Most spaces of indentation after the one newline allowed between two tokens of JSON.
pub const MAX_WS: u8 = 20;
/// Most digits of an integer part or a fraction.
pub const MAX_DIGITS: u8 = 16;

/// Where in a container a frame is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// After `{` or `[`: a key / an item, or the end.
    First,
    /// After `,`: a key / an item.
    Next,
    /// After a key: `:`.
    Colon,
    /// After `:`: the value.
    BeforeValue,
    /// After a value or an item: `,` or the end.
    After,
}

const N_START: u8 = 0;
const N_MINUS: u8 = 1;
const N_ZERO: u8 = 2;
const N_INT: u8 = 3;
const N_DOT: u8 = 4;
const N_FRAC: u8 = 5;
const N_E: u8 = 6;
const N_ESIGN: u8 = 7;
const N_EXP: u8 = 8;

/// One level of the automaton's stack.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub(crate) enum Frame {
    /// A value of the node starts at the next byte.
    Value(NodeId),
    /// Inside the literals `lo..hi` of a literal node (sorted: they share the first `at`
    /// bytes).
    Lit {
        node: NodeId,
        lo: u16,
        hi: u16,
        at: u16,
    },
    /// Inside the key of property `prop` of an object node, `at` bytes read.
    Key { node: NodeId, prop: u16, at: u16 },
    /// Inside a string: characters so far (counted only for a bounded node), an escape in
    /// progress (1: after `\`; 2..=5: hex digits left + 1) and UTF-8 continuation bytes
    /// expected (`lo`: the range of the first, see [`continuation`]).
    Str {
        node: NodeId,
        chars: u32,
        esc: u8,
        utf8: u8,
        lo: u8,
    },
    /// Inside a number.
    Num {
        integer: bool,
        phase: u8,
        digits: u8,
    },
    /// Inside an object: properties from `next` on are still to come.
    Obj {
        node: NodeId,
        next: u16,
        phase: Phase,
        ws: u8,
    },
    /// Inside an array: `count` items so far.
    Arr {
        node: NodeId,
        count: u32,
        phase: Phase,
        ws: u8,
    },
    /// Inside a sequence: its parts before `at` have started.
    Seq { node: NodeId, at: u16 },
}

type Stack = Vec<Frame>;

/// The automaton's state: every stack it may be in, sorted and without duplicates.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct State(Vec<Stack>);

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t' | b'\r')
}

/// The whitespace state after byte `b` (`ws`: 0 none yet, 1 one space, 2 + n a newline and
/// n spaces), `None` when `b` may not come: a gap holds nothing, one space, or one newline
/// and at most [`MAX_WS`] spaces.
fn ws_step(ws: u8, b: u8) -> Option<u8> {
    match (ws, b) {
        (0, b' ') => Some(1),
        (0, b'\n') => Some(2),
        (2.., b' ') if ws - 2 < MAX_WS => Some(ws + 1),
        _ => None,
    }
}

/// Whether `b` may be the first continuation byte after a lead byte of class `lo` (UTF-8
/// without overlong forms, surrogates or code points above U+10FFFF).
fn continuation(lo: u8, b: u8) -> bool {
    match lo {
        1 => (0xA0..=0xBF).contains(&b),
        2 => (0x80..=0x9F).contains(&b),
        3 => (0x90..=0xBF).contains(&b),
        4 => (0x80..=0x8F).contains(&b),
        _ => (0x80..=0xBF).contains(&b),
    }
}

fn num_step(integer: bool, phase: u8, digits: u8, b: u8) -> Option<(u8, u8)> {
    let digit = b.is_ascii_digit();
    let frac_ok = !integer;
    Some(match (phase, b) {
        (N_START, b'-') => (N_MINUS, 0),
        (N_START | N_MINUS, b'0') => (N_ZERO, 0),
        (N_START | N_MINUS, _) if digit => (N_INT, 1),
        (N_INT, _) if digit && digits < MAX_DIGITS => (N_INT, digits + 1),
        (N_ZERO | N_INT, b'.') if frac_ok => (N_DOT, 0),
        (N_ZERO | N_INT | N_FRAC, b'e' | b'E') if frac_ok => (N_E, 0),
        (N_DOT, _) if digit => (N_FRAC, 1),
        (N_FRAC, _) if digit && digits < MAX_DIGITS => (N_FRAC, digits + 1),
        (N_E, b'+' | b'-') => (N_ESIGN, 0),
        (N_E | N_ESIGN, _) if digit => (N_EXP, 1),
        (N_EXP, _) if digit && digits < 3 => (N_EXP, digits + 1),
        _ => return None,
    })
}

fn num_complete(phase: u8) -> bool {
    matches!(phase, N_ZERO | N_INT | N_FRAC | N_EXP)
}

impl Grammar {
    /// The state before the first byte.
    pub(crate) fn start(&self) -> State {
        State(vec![vec![Frame::Value(self.root)]])
    }

    /// The state after byte `b`, `None` when the grammar cannot read it.
    pub(crate) fn step(&self, state: &State, b: u8) -> Option<State> {
        let mut out = Vec::new();
        for stack in &state.0 {
            self.advance(stack.clone(), b, &mut out);
        }
        if out.is_empty() {
            return None;
        }
        out.sort_unstable();
        out.dedup();
        Some(State(out))
    }

    /// The state after `bytes`, `None` when the grammar cannot read them.
    pub(crate) fn walk(&self, state: &State, bytes: &[u8]) -> Option<State> {
        let mut s = state.clone();
        for &b in bytes {
            if self.passes_unchanged(&s, b) {
                continue;
            }
            s = self.step(&s, b)?;
        }
        Some(s)
    }

    /// Whether byte `b` leaves `state` as it is: a plain character inside an unbounded
    /// string (the common case inside long strings, checked without copying the state).
    pub(crate) fn passes_unchanged(&self, state: &State, b: u8) -> bool {
        let [stack] = state.0.as_slice() else {
            return false;
        };
        match stack.last() {
            Some(&Frame::Str {
                node,
                esc: 0,
                utf8: 0,
                ..
            }) => (0x20..0x80).contains(&b) && b != b'"' && b != b'\\' && !self.counts_chars(node),
            _ => false,
        }
    }

    /// Whether the value may end here (the text so far is a whole value of the grammar).
    pub(crate) fn is_complete(&self, state: &State) -> bool {
        state.0.iter().any(|stack| {
            stack.iter().rev().all(|f| match *f {
                Frame::Num { phase, .. } => num_complete(phase),
                Frame::Seq { node, at } => match self.node(node) {
                    Node::Seq(parts) => at as usize >= parts.len(),
                    _ => false,
                },
                _ => false,
            })
        })
    }

    /// Whether some byte may still follow.
    pub(crate) fn can_continue(&self, state: &State) -> bool {
        state.0.iter().any(|s| !s.is_empty())
    }

    fn counts_chars(&self, node: NodeId) -> bool {
        matches!(self.node(node), Node::String { min, max } if *min > 0 || *max != UNBOUNDED)
    }

    /// A value of `node` starting with byte `b` on top of `stack`.
    fn begin(&self, mut stack: Stack, node: NodeId, b: u8, out: &mut Vec<Stack>) {
        if stack.len() >= MAX_DEPTH {
            return;
        }
        match self.node(node) {
            Node::Any => {
                let next = match b {
                    b'{' => ANY_OBJECT,
                    b'[' => ANY_ARRAY,
                    b'"' => ANY_STRING,
                    b't' | b'f' | b'n' => ANY_LITERAL,
                    _ => ANY_NUMBER,
                };
                self.begin(stack, next, b, out);
            }
            Node::AnyObject | Node::Object(_) if b == b'{' => {
                stack.push(Frame::Obj {
                    node,
                    next: 0,
                    phase: Phase::First,
                    ws: 0,
                });
                out.push(stack);
            }
            Node::Array { .. } if b == b'[' => {
                stack.push(Frame::Arr {
                    node,
                    count: 0,
                    phase: Phase::First,
                    ws: 0,
                });
                out.push(stack);
            }
            Node::String { .. } if b == b'"' => {
                stack.push(Frame::Str {
                    node,
                    chars: 0,
                    esc: 0,
                    utf8: 0,
                    lo: 0,
                });
                out.push(stack);
            }
            Node::Number { integer } => {
                if let Some((phase, digits)) = num_step(*integer, N_START, 0, b) {
                    stack.push(Frame::Num {
                        integer: *integer,
                        phase,
                        digits,
                    });
                    out.push(stack);
                }
            }
            Node::Literals(lits) => {
                let lo = lits.partition_point(|l| l.first().is_some_and(|&c| c < b));
                let hi = lits.partition_point(|l| l.first().is_some_and(|&c| c <= b));
                self.literal_range(stack, node, lits, lo, hi, 1, out);
            }
            Node::AnyOf(alts) => {
                for &alt in alts {
                    self.begin(stack.clone(), alt, b, out);
                }
            }
            Node::Seq(parts) => {
                if let Some(&first) = parts.first() {
                    stack.push(Frame::Seq { node, at: 1 });
                    self.begin(stack, first, b, out);
                }
            }
            _ => {}
        }
    }

    /// Literals `lo..hi` of `lits` share their first `at` bytes, just read: those that end
    /// here complete (popped), the others go on.
    #[allow(clippy::too_many_arguments)]
    fn literal_range(
        &self,
        stack: Stack,
        node: NodeId,
        lits: &[Vec<u8>],
        mut lo: usize,
        hi: usize,
        at: usize,
        out: &mut Vec<Stack>,
    ) {
        if lo >= hi {
            return;
        }
        // Sorted: the literal that ends here (at most one: they are distinct) comes first.
        if lits[lo].len() == at {
            out.push(stack.clone());
            lo += 1;
        }
        if lo < hi {
            let mut stack = stack;
            stack.push(Frame::Lit {
                node,
                lo: lo as u16,
                hi: hi as u16,
                at: at as u16,
            });
            out.push(stack);
        }
    }

    /// Reads byte `b` on `stack`, pushing the stacks that result onto `out`.
    fn advance(&self, mut stack: Stack, b: u8, out: &mut Vec<Stack>) {
        loop {
            let Some(&top) = stack.last() else {
                // The value is complete: nothing may follow it.
                return;
            };
            let i = stack.len() - 1;
            match top {
                Frame::Value(node) => {
                    stack.pop();
                    self.begin(stack, node, b, out);
                }
                Frame::Lit { node, lo, hi, at } => {
                    let Node::Literals(lits) = self.node(node) else {
                        return;
                    };
                    let (lo, hi, at) = (lo as usize, hi as usize, at as usize);
                    let range = &lits[lo..hi];
                    let first = lo + range.partition_point(|l| l[at] < b);
                    let end = lo + range.partition_point(|l| l[at] <= b);
                    stack.pop();
                    self.literal_range(stack, node, lits, first, end, at + 1, out);
                }
                Frame::Key { node, prop, at } => {
                    let Some(p) = self.prop(node, prop as usize) else {
                        return;
                    };
                    if p.key.get(at as usize) == Some(&b) {
                        if at as usize + 1 == p.key.len() {
                            stack.pop();
                        } else {
                            stack[i] = Frame::Key {
                                node,
                                prop,
                                at: at + 1,
                            };
                        }
                        out.push(stack);
                    }
                }
                Frame::Str { .. } => {
                    if let Some(next) = self.string_byte(top, b) {
                        match next {
                            Some(f) => stack[i] = f,
                            None => {
                                stack.pop();
                            }
                        }
                        out.push(stack);
                    }
                }
                Frame::Num {
                    integer,
                    phase,
                    digits,
                } => match num_step(integer, phase, digits, b) {
                    Some((phase, digits)) => {
                        stack[i] = Frame::Num {
                            integer,
                            phase,
                            digits,
                        };
                        out.push(stack);
                    }
                    // The number ended before `b`: its container reads `b`.
                    None if num_complete(phase) => {
                        stack.pop();
                        continue;
                    }
                    None => {}
                },
                Frame::Seq { node, at } => {
                    let Node::Seq(parts) = self.node(node) else {
                        return;
                    };
                    match parts.get(at as usize) {
                        Some(&part) => {
                            stack[i] = Frame::Seq { node, at: at + 1 };
                            self.begin(stack, part, b, out);
                        }
                        None => {
                            stack.pop();
                            continue;
                        }
                    }
                }
                Frame::Obj { .. } => self.object_byte(stack, top, b, out),
                Frame::Arr { .. } => self.array_byte(stack, top, b, out),
            }
            return;
        }
    }

    /// A string frame after byte `b`: `Some(Some(frame))` goes on, `Some(None)` closed the
    /// string, `None` cannot be.
    fn string_byte(&self, frame: Frame, b: u8) -> Option<Option<Frame>> {
        let Frame::Str {
            node,
            chars,
            esc,
            utf8,
            lo,
        } = frame
        else {
            return None;
        };
        let (min, max, counted) = match self.node(node) {
            Node::String { min, max } => (*min, *max, *min > 0 || *max != UNBOUNDED),
            _ => (0, UNBOUNDED, false),
        };
        // A new character, where the bound allows one.
        let new_char = || -> Option<u32> {
            if !counted {
                Some(0)
            } else if chars < max {
                Some(chars + 1)
            } else {
                None
            }
        };
        let with = |chars: u32, esc: u8, utf8: u8, lo: u8| {
            Some(Some(Frame::Str {
                node,
                chars,
                esc,
                utf8,
                lo,
            }))
        };
        if utf8 > 0 {
            return if continuation(lo, b) {
                with(chars, 0, utf8 - 1, 0)
            } else {
                None
            };
        }
        match esc {
            1 => match b {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => with(chars, 0, 0, 0),
                b'u' => with(chars, 5, 0, 0),
                _ => None,
            },
            // No surrogate escapes (`\uD800`-`\uDFFF`): a lone one is not valid UTF-8.
            5 if matches!(b, b'd' | b'D') => None,
            2..=5 if b.is_ascii_hexdigit() => with(chars, if esc == 2 { 0 } else { esc - 1 }, 0, 0),
            2..=5 => None,
            _ => match b {
                b'"' if chars >= min || !counted => Some(None),
                b'"' => None,
                b'\\' => with(new_char()?, 1, 0, 0),
                0..=0x1F => None,
                0x20..=0x7F => with(new_char()?, 0, 0, 0),
                0xC2..=0xDF => with(new_char()?, 0, 1, 0),
                0xE0 => with(new_char()?, 0, 2, 1),
                0xED => with(new_char()?, 0, 2, 2),
                0xE1..=0xEF => with(new_char()?, 0, 2, 0),
                0xF0 => with(new_char()?, 0, 3, 3),
                0xF4 => with(new_char()?, 0, 3, 4),
                0xF1..=0xF3 => with(new_char()?, 0, 3, 0),
                _ => None,
            },
        }
    }

    /// Whether object node `node` may close with its properties from `next` on left out.
    fn may_close(&self, node: NodeId, next: u16) -> bool {
        match self.node(node) {
            Node::Object(props) => !props.iter().skip(next as usize).any(|p| p.required),
            _ => true,
        }
    }

    fn object_byte(&self, mut stack: Stack, top: Frame, b: u8, out: &mut Vec<Stack>) {
        let Frame::Obj {
            node,
            next,
            phase,
            ws,
        } = top
        else {
            return;
        };
        let i = stack.len() - 1;
        let set = |phase: Phase, next: u16, ws: u8| Frame::Obj {
            node,
            next,
            phase,
            ws,
        };
        if is_ws(b) {
            if let Some(ws) = ws_step(ws, b) {
                stack[i] = set(phase, next, ws);
                out.push(stack);
            }
            return;
        }
        match (phase, b) {
            (Phase::First | Phase::After, b'}') if self.may_close(node, next) => {
                stack.pop();
                out.push(stack);
            }
            (Phase::First | Phase::Next, b'"') => match self.node(node) {
                Node::Object(props) => {
                    for (j, p) in props.iter().enumerate().skip(next as usize) {
                        let mut s = stack.clone();
                        s[i] = set(Phase::Colon, j as u16 + 1, 0);
                        s.push(Frame::Key {
                            node,
                            prop: j as u16,
                            at: 1,
                        });
                        out.push(s);
                        if p.required {
                            break;
                        }
                    }
                }
                _ if stack.len() < MAX_DEPTH => {
                    stack[i] = set(Phase::Colon, next, 0);
                    stack.push(Frame::Str {
                        node: ANY_STRING,
                        chars: 0,
                        esc: 0,
                        utf8: 0,
                        lo: 0,
                    });
                    out.push(stack);
                }
                _ => {}
            },
            (Phase::Colon, b':') => {
                stack[i] = set(Phase::BeforeValue, next, 0);
                out.push(stack);
            }
            (Phase::BeforeValue, _) => {
                let value = match self.node(node) {
                    Node::Object(props) => match props.get(next as usize - 1) {
                        Some(p) => p.value,
                        None => return,
                    },
                    _ => ANY,
                };
                stack[i] = set(Phase::After, next, 0);
                self.begin(stack, value, b, out);
            }
            (Phase::After, b',') => {
                let more = match self.node(node) {
                    Node::Object(props) => (next as usize) < props.len(),
                    _ => true,
                };
                if more {
                    stack[i] = set(Phase::Next, next, 0);
                    out.push(stack);
                }
            }
            _ => {}
        }
    }

    fn array_byte(&self, mut stack: Stack, top: Frame, b: u8, out: &mut Vec<Stack>) {
        let Frame::Arr {
            node,
            count,
            phase,
            ws,
        } = top
        else {
            return;
        };
        let i = stack.len() - 1;
        let (items, min, max) = match self.node(node) {
            Node::Array { items, min, max } => (*items, *min, *max),
            _ => return,
        };
        if is_ws(b) {
            if let Some(ws) = ws_step(ws, b) {
                stack[i] = Frame::Arr {
                    node,
                    count,
                    phase,
                    ws,
                };
                out.push(stack);
            }
            return;
        }
        let item = |stack: &mut Stack, count: u32| {
            stack[i] = Frame::Arr {
                node,
                count,
                phase: Phase::After,
                ws: 0,
            };
        };
        match (phase, b) {
            (Phase::First, b']') if min == 0 => {
                stack.pop();
                out.push(stack);
            }
            (Phase::After, b']') if count >= min => {
                stack.pop();
                out.push(stack);
            }
            (Phase::After, b',') if count < max => {
                stack[i] = Frame::Arr {
                    node,
                    count,
                    phase: Phase::Next,
                    ws: 0,
                };
                out.push(stack);
            }
            (Phase::First | Phase::Next, _)
                if count < max && !(phase == Phase::First && b == b']') =>
            {
                item(&mut stack, count + 1);
                self.begin(stack, items, b, out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Json;
    use super::*;

    fn grammar(schema: &str) -> Grammar {
        Grammar::json_schema(&serde_json::from_str::<Json>(schema).unwrap()).unwrap()
    }

    /// Whether `g` accepts exactly `text` (a whole value).
    fn accepts(g: &Grammar, text: &str) -> bool {
        g.walk(&g.start(), text.as_bytes())
            .is_some_and(|s| g.is_complete(&s))
    }

    /// Whether `text` is a prefix of something `g` accepts.
    fn prefix(g: &Grammar, text: &str) -> bool {
        g.walk(&g.start(), text.as_bytes()).is_some()
    }

    #[test]
    fn an_object_schema_accepts_its_objects_in_order() {
        let g = grammar(
            r#"{"type":"object","properties":{
                "name":{"type":"string","maxLength":5},
                "age":{"type":"integer"},
                "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2},
                "ok":{"type":"boolean"}},
              "required":["name","ok"]}"#,
        );
        for good in [
            r#"{"name":"ann","ok":true}"#,
            r#"{"name": "ann", "age": -12, "ok": false}"#,
            "{\n  \"name\": \"é\",\n  \"tags\": [\"a\", \"b\"],\n  \"ok\": true\n}",
            r#"{"name":"","age":0,"tags":[],"ok":true}"#,
            r#"{"name":"a\"\u00e9\n","ok":true}"#,
        ] {
            assert!(accepts(&g, good), "{good}");
        }
        for bad in [
            r#"{"ok":true}"#,                                 // name is required
            r#"{"age":1,"name":"a","ok":true}"#,              // out of order
            r#"{"name":"toolong","ok":true}"#,                // maxLength
            r#"{"name":"a","tags":["a","b","a"],"ok":true}"#, // maxItems
            r#"{"name":"a","tags":["c"],"ok":true}"#,         // enum
            r#"{"name":"a","age":1.5,"ok":true}"#,            // integer
            r#"{"name":"a","ok":true,}"#,                     // trailing comma
            r#" {"name":"a","ok":true}"#,                     // leading whitespace
            r#"{"name":"a","ok":true} "#,                     // trailing whitespace
            r#"{"name":"a","ok":tru}"#,
            r#"{"name":"\ud800","ok":true}"#,    // a lone surrogate
            "{\"name\":\"a\u{1}\",\"ok\":true}", // a raw control character
        ] {
            assert!(!accepts(&g, bad), "{bad}");
        }
        assert!(prefix(&g, r#"{"name":"ab"#));
        assert!(!prefix(&g, r#"{"nam":"#));
        assert!(!accepts(&g, r#"{"name":"ab"#));
    }

    #[test]
    fn utf8_is_checked_byte_by_byte() {
        let g = grammar(r#"{"type":"string"}"#);
        assert!(accepts(&g, "\"日本語 🎉\""));
        for bad in [
            &b"\"\xC0\xAF\""[..],    // overlong
            b"\"\xED\xA0\x80\"",     // a surrogate
            b"\"\xF4\x90\x80\x80\"", // above U+10FFFF
            b"\"\x80\"",             // a lone continuation byte
            b"\"\xE6\x97\"",         // a character cut short
        ] {
            assert!(
                !g.walk(&g.start(), bad).is_some_and(|s| g.is_complete(&s)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn numbers_any_values_and_bounds() {
        let g = grammar(r#"{"type":"number"}"#);
        for good in ["0", "-0.5", "12e3", "1.25E-7", "7"] {
            assert!(accepts(&g, good), "{good}");
        }
        for bad in ["01", "1.", ".5", "+1", "1e", "--1", "12345678901234567"] {
            assert!(!accepts(&g, bad), "{bad}");
        }
        let any = Grammar::json_object();
        assert!(accepts(
            &any,
            r#"{"a":[1,{"b":null},"x",true,false,-2.5e3],"c":{}}"#
        ));
        assert!(!accepts(&any, "[1]"));
        assert!(!accepts(&any, r#"{"a":01}"#));
        // Whitespace between tokens: nothing, a space, or a newline and an indentation.
        let indented = format!("{{\n{}\"a\": [\n  1\n]\n}}", " ".repeat(MAX_WS as usize));
        assert!(accepts(&any, &indented));
        for bad in [
            format!("{{\n{}}}", " ".repeat(MAX_WS as usize + 1)),
            "{  }".to_string(),
            "{\n\n}".to_string(),
            "{ \n}".to_string(),
            "{\n\t}".to_string(),
        ] {
            assert!(!prefix(&any, &bad), "{bad:?}");
        }
        // Nesting is bounded.
        let deep = "[".repeat(MAX_DEPTH + 1);
        let any_value = grammar("{}");
        assert!(prefix(&any_value, &deep[..MAX_DEPTH]));
        assert!(!prefix(&any_value, &deep));
    }

    #[test]
    fn any_of_enums_and_references_branch_and_join() {
        let g = grammar(
            r##"{"anyOf":[{"type":"null"},{"enum":["a","ab",3,{"k":1}]},
                 {"$ref":"#/$defs/pair"}],
                 "$defs":{"pair":{"type":"array","items":{"type":"integer"},
                                   "minItems":2,"maxItems":2}}}"##,
        );
        for good in ["null", r#""a""#, r#""ab""#, "3", r#"{"k":1}"#, "[1, 2]"] {
            assert!(accepts(&g, good), "{good}");
        }
        for bad in [r#""abc""#, "4", "[1]", "[1,2,3]", r#"{"k": 1}"#] {
            assert!(!accepts(&g, bad), "{bad}");
        }
        let list = grammar(
            r##"{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},
                 "next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},"required":["v","next"]}},
                 "$ref":"#/$defs/n"}"##,
        );
        assert!(accepts(
            &list,
            r#"{"v":1,"next":{"v":2,"next":{"v":3,"next":null}}}"#
        ));
    }

    #[test]
    fn a_tool_call_is_text_around_json() {
        let params: Json = serde_json::from_str(
            r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#,
        )
        .unwrap();
        let g = Grammar::tool_call(
            &[
                ("get_weather".into(), params),
                ("noop".into(), serde_json::from_str("{}").unwrap()),
            ],
            "<tool_call>\n",
            "\n</tool_call>",
        )
        .unwrap();
        assert!(accepts(
            &g,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        ));
        assert!(accepts(
            &g,
            "<tool_call>\n{\"name\":\"noop\",\"arguments\":[1]}\n</tool_call>"
        ));
        assert!(!accepts(
            &g,
            "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"
        ));
        assert!(!accepts(
            &g,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"
        ));
    }
}
