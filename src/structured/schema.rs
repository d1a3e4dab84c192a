//! A JSON schema (the subset [`Grammar::json_schema`] documents) compiled into a graph of
//! nodes that the byte automaton walks ([`super::automaton`]).

use super::Json;
use std::collections::HashMap;

/// A node's index in [`Grammar::nodes`].
pub(crate) type NodeId = u32;

/// Any JSON value.
pub(crate) const ANY: NodeId = 0;
/// Any string (the keys of objects with no listed properties).
pub(crate) const ANY_STRING: NodeId = 1;
/// `true`, `false` and `null` (the literals of [`ANY`]).
pub(crate) const ANY_LITERAL: NodeId = 2;
/// Any object.
pub(crate) const ANY_OBJECT: NodeId = 3;
/// Any array.
pub(crate) const ANY_ARRAY: NodeId = 4;
/// Any number.
pub(crate) const ANY_NUMBER: NodeId = 5;

/// No upper bound (string length, array items).
pub(crate) const UNBOUNDED: u32 = u32::MAX;

/// Most nodes one grammar may have: a schema is a request's input, so its size is bounded.
pub const MAX_NODES: usize = 4096;
/// Most bytes of literals (`enum`, `const`, property names) in one grammar.
pub const MAX_LITERAL_BYTES: usize = 256 << 10;

/// A property of an object node: its key as JSON text (quotes included) and its value.
#[derive(Debug, Clone)]
pub(crate) struct Prop {
    pub key: Vec<u8>,
    pub value: NodeId,
    pub required: bool,
}

/// What a node matches.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// Any JSON value.
    Any,
    /// An object with any keys and values.
    AnyObject,
    /// An object of the listed properties, in their order; the optional ones may be left
    /// out.
    Object(Vec<Prop>),
    /// An array of `items`, `min..=max` of them.
    Array { items: NodeId, min: u32, max: u32 },
    /// A string of `min..=max` characters.
    String { min: u32, max: u32 },
    /// A number (an integer: no fraction and no exponent).
    Number { integer: bool },
    /// One of these texts exactly, sorted (JSON literals, enum values, fixed text).
    Literals(Vec<Vec<u8>>),
    /// A value of any of these nodes.
    AnyOf(Vec<NodeId>),
    /// These nodes one after the other, nothing between them.
    Seq(Vec<NodeId>),
    /// A `$ref` target not compiled yet (never left in a finished grammar).
    Pending,
}

/// Why a schema cannot be used for structured output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// A keyword outside the supported subset.
    #[error(
        "the JSON schema keyword `{keyword}` (at {at}) is not supported: structured output \
         understands type, properties, required, items, enum, const, anyOf, $ref/$defs, \
         minItems/maxItems and minLength/maxLength"
    )]
    Unsupported {
        /// The keyword.
        keyword: String,
        /// Where it is (a JSON pointer into the schema).
        at: String,
    },
    /// A schema that is malformed or matches nothing.
    #[error("the JSON schema at {at} is invalid: {reason}")]
    Invalid {
        /// Where (a JSON pointer into the schema).
        at: String,
        /// Why.
        reason: String,
    },
    /// A schema over the size bounds ([`MAX_NODES`], [`MAX_LITERAL_BYTES`]).
    #[error("the JSON schema is too large: more than {limit} {what}")]
    TooLarge {
        /// Nodes or literal bytes.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
}

/// A compiled grammar: what structured output may generate. Build one per request (schemas
/// are small); share it by `Arc` between the constraints that use it.
#[derive(Debug, Clone)]
pub struct Grammar {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: NodeId,
}

/// Keywords that only describe a schema: accepted and ignored.
const ANNOTATIONS: [&str; 10] = [
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Keywords the compiler understands.
const KEYWORDS: [&str; 15] = [
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "additionalProperties",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
];

fn invalid(at: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Invalid {
        at: if at.is_empty() { "/".into() } else { at.into() },
        reason: reason.into(),
    }
}

/// The JSON text of `s` as a string literal (quotes and escapes included).
pub(crate) fn quoted(s: &str) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_default()
}

impl Grammar {
    fn base() -> Grammar {
        let mut lits = vec![b"true".to_vec(), b"false".to_vec(), b"null".to_vec()];
        lits.sort();
        Grammar {
            nodes: vec![
                Node::Any,
                Node::String {
                    min: 0,
                    max: UNBOUNDED,
                },
                Node::Literals(lits),
                Node::AnyObject,
                Node::Array {
                    items: ANY,
                    min: 0,
                    max: UNBOUNDED,
                },
                Node::Number { integer: false },
            ],
            root: ANY,
        }
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    pub fn json_object() -> Grammar {
        Grammar {
            root: ANY_OBJECT,
            ..Grammar::base()
        }
    }

    /// A value of `schema`, a JSON schema of this subset: `type` (one or a list: object,
    /// array, string, number, integer, boolean, null), `properties` (generated in their
    /// order; only those listed), `required`, `additionalProperties` (absent, `true` or
    /// `false`: only the listed properties are generated either way), `items`, `enum`,
    /// `const`, `anyOf`, `$ref` to `#/$defs/...` or `#/definitions/...` (recursion
    /// included), `minItems`/`maxItems`, `minLength`/`maxLength`; annotations (`title`,
    /// `description`, `default`, `examples`, ...) are ignored. `true` or `{}` is any value.
    ///
    /// # Errors
    /// [`SchemaError::Unsupported`] naming a keyword outside the subset (`pattern`,
    /// `format`, `minimum`, `oneOf`, `allOf`, ...), [`SchemaError::Invalid`] for a
    /// malformed schema or one nothing matches, [`SchemaError::TooLarge`].
    pub fn json_schema(schema: &Json) -> Result<Grammar, SchemaError> {
        let mut b = Builder {
            grammar: Grammar::base(),
            root: schema,
            refs: HashMap::new(),
            pending: Vec::new(),
            literal_bytes: 0,
        };
        let root = b.compile(schema, "")?;
        while let Some((id, path)) = b.pending.pop() {
            let target = b.resolve(&path)?;
            let node = b.compile(target, &path)?;
            // The reference points at the compiled node: alias it.
            b.grammar.nodes[id as usize] = Node::AnyOf(vec![node]);
        }
        b.grammar.root = root;
        Ok(b.grammar)
    }

    /// One call of one of `tools` in the text format `open` + JSON + `close`, the JSON being
    /// `{"name": NAME, "arguments": ARGS}` where ARGS is a value of that tool's parameters
    /// schema (Hermes-style tool calls: Qwen2.5's `<tool_call>\n` ... `\n</tool_call>`).
    ///
    /// # Errors
    /// As [`Grammar::json_schema`] for each tool's parameters.
    pub fn tool_call(
        tools: &[(String, Json)],
        open: &str,
        close: &str,
    ) -> Result<Grammar, SchemaError> {
        let mut b = Builder {
            grammar: Grammar::base(),
            root: &Json::Null,
            refs: HashMap::new(),
            pending: Vec::new(),
            literal_bytes: 0,
        };
        let mut calls = Vec::new();
        for (name, params) in tools {
            b.root = params;
            let args = b.compile(params, "")?;
            while let Some((id, path)) = b.pending.pop() {
                let target = b.resolve(&path)?;
                let node = b.compile(target, &path)?;
                b.grammar.nodes[id as usize] = Node::AnyOf(vec![node]);
            }
            b.refs.clear();
            let name = b.literals(vec![quoted(name)])?;
            calls.push(b.add(Node::Object(vec![
                Prop {
                    key: quoted("name"),
                    value: name,
                    required: true,
                },
                Prop {
                    key: quoted("arguments"),
                    value: args,
                    required: true,
                },
            ]))?);
        }
        if calls.is_empty() {
            return Err(invalid("", "no tool to call"));
        }
        let call = b.add(Node::AnyOf(calls))?;
        let open = b.literals(vec![open.as_bytes().to_vec()])?;
        let close = b.literals(vec![close.as_bytes().to_vec()])?;
        b.grammar.root = b.add(Node::Seq(vec![open, call, close]))?;
        Ok(b.grammar)
    }

    /// Property `prop` of object node `node`.
    pub(crate) fn prop(&self, node: NodeId, prop: usize) -> Option<&Prop> {
        match &self.nodes[node as usize] {
            Node::Object(props) => props.get(prop),
            _ => None,
        }
    }

    /// The node `id`.
    pub(crate) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }
}

struct Builder<'s> {
    grammar: Grammar,
    root: &'s Json,
    /// `$ref` paths already given a node.
    refs: HashMap<String, NodeId>,
    /// `$ref` nodes to compile: the node and the pointer it names.
    pending: Vec<(NodeId, String)>,
    literal_bytes: usize,
}

impl<'s> Builder<'s> {
    fn add(&mut self, node: Node) -> Result<NodeId, SchemaError> {
        if self.grammar.nodes.len() >= MAX_NODES {
            return Err(SchemaError::TooLarge {
                what: "nodes",
                limit: MAX_NODES,
            });
        }
        self.grammar.nodes.push(node);
        Ok(self.grammar.nodes.len() as NodeId - 1)
    }

    fn literals(&mut self, mut lits: Vec<Vec<u8>>) -> Result<NodeId, SchemaError> {
        if lits.iter().any(Vec::is_empty) {
            return Err(invalid("", "an empty literal matches nothing"));
        }
        self.literal_bytes += lits.iter().map(Vec::len).sum::<usize>();
        if self.literal_bytes > MAX_LITERAL_BYTES {
            return Err(SchemaError::TooLarge {
                what: "bytes of literals",
                limit: MAX_LITERAL_BYTES,
            });
        }
        lits.sort();
        lits.dedup();
        self.add(Node::Literals(lits))
    }

    /// The schema a local `$ref` (`#/$defs/Name`, `#/definitions/Name`, `#`) points at.
    fn resolve(&self, pointer: &str) -> Result<&'s Json, SchemaError> {
        let Some(rest) = pointer.strip_prefix('#') else {
            return Err(invalid(
                pointer,
                "only local references (`#/...`) are supported",
            ));
        };
        let mut at = self.root;
        for part in rest.split('/').skip(1) {
            let part = part.replace("~1", "/").replace("~0", "~");
            at = match at {
                Json::Object(_) => at.get(&part),
                Json::Array(a) => part.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| invalid(pointer, "the reference names nothing in the schema"))?;
        }
        Ok(at)
    }

    fn compile(&mut self, s: &'s Json, at: &str) -> Result<NodeId, SchemaError> {
        let fields = match s {
            Json::Bool(true) => return Ok(ANY),
            Json::Bool(false) => return Err(invalid(at, "`false` matches no value")),
            Json::Object(f) => f,
            _ => return Err(invalid(at, "a schema is an object or a boolean")),
        };
        for (i, (k, _)) in fields.iter().enumerate() {
            if fields[..i].iter().any(|(other, _)| other == k) {
                return Err(invalid(at, format!("the keyword `{k}` is given twice")));
            }
            if !KEYWORDS.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
                return Err(SchemaError::Unsupported {
                    keyword: k.clone(),
                    at: if at.is_empty() { "/".into() } else { at.into() },
                });
            }
        }
        let here = |k: &str| format!("{at}/{k}");
        let constraining: Vec<&str> = fields
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !ANNOTATIONS.contains(k) && !matches!(*k, "$defs" | "definitions"))
            .collect();
        if let Some(r) = s.get("$ref") {
            if constraining.len() > 1 {
                return Err(invalid(at, "`$ref` beside other keywords is not supported"));
            }
            let pointer = r
                .as_str()
                .ok_or_else(|| invalid(&here("$ref"), "must be a string"))?
                .to_string();
            if let Some(&id) = self.refs.get(&pointer) {
                return Ok(id);
            }
            self.resolve(&pointer)?;
            let id = self.add(Node::Pending)?;
            self.refs.insert(pointer.clone(), id);
            self.pending.push((id, pointer));
            return Ok(id);
        }
        if let Some(c) = s.get("const") {
            return self.literals(vec![c.compact().into_bytes()]);
        }
        if let Some(e) = s.get("enum") {
            let values = e
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| invalid(&here("enum"), "must be a non-empty array"))?;
            return self.literals(values.iter().map(|v| v.compact().into_bytes()).collect());
        }
        if let Some(alts) = s.get("anyOf") {
            if constraining.len() > 1 {
                return Err(invalid(
                    at,
                    "`anyOf` beside other keywords is not supported",
                ));
            }
            let alts = alts
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| invalid(&here("anyOf"), "must be a non-empty array"))?;
            let mut ids = Vec::with_capacity(alts.len());
            for (i, alt) in alts.iter().enumerate() {
                ids.push(self.compile(alt, &format!("{at}/anyOf/{i}"))?);
            }
            return self.add(Node::AnyOf(ids));
        }
        let types: Vec<&str> = match s.get("type") {
            None if s.get("properties").is_some() || s.get("required").is_some() => {
                vec!["object"]
            }
            None if s.get("items").is_some() => vec!["array"],
            None => return Ok(ANY),
            Some(Json::String(t)) => vec![t.as_str()],
            Some(Json::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| invalid(&here("type"), "a list of type names"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid(&here("type"), "a type name or a list of them")),
        };
        let mut ids = Vec::with_capacity(types.len());
        for t in types {
            ids.push(self.typed(s, t, at)?);
        }
        if ids.len() == 1 {
            Ok(ids[0])
        } else {
            self.add(Node::AnyOf(ids))
        }
    }

    fn count(s: &Json, key: &str, at: &str) -> Result<Option<u32>, SchemaError> {
        match s.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n.min(u64::from(UNBOUNDED - 1)) as u32))
                .ok_or_else(|| invalid(&format!("{at}/{key}"), "must be a non-negative integer")),
        }
    }

    fn typed(&mut self, s: &'s Json, t: &str, at: &str) -> Result<NodeId, SchemaError> {
        match t {
            "object" => self.object(s, at),
            "array" => {
                let items = match s.get("items") {
                    None => ANY,
                    Some(i) => self.compile(i, &format!("{at}/items"))?,
                };
                let min = Self::count(s, "minItems", at)?.unwrap_or(0);
                let max = Self::count(s, "maxItems", at)?.unwrap_or(UNBOUNDED);
                if min > max {
                    return Err(invalid(at, "minItems is above maxItems"));
                }
                self.add(Node::Array { items, min, max })
            }
            "string" => {
                let min = Self::count(s, "minLength", at)?.unwrap_or(0);
                let max = Self::count(s, "maxLength", at)?.unwrap_or(UNBOUNDED);
                if min > max {
                    return Err(invalid(at, "minLength is above maxLength"));
                }
                if min == 0 && max == UNBOUNDED {
                    return Ok(ANY_STRING);
                }
                self.add(Node::String { min, max })
            }
            "number" => Ok(ANY_NUMBER),
            "integer" => self.add(Node::Number { integer: true }),
            "boolean" => self.literals(vec![b"true".to_vec(), b"false".to_vec()]),
            "null" => self.literals(vec![b"null".to_vec()]),
            other => Err(invalid(
                &format!("{at}/type"),
                format!("`{other}` is not a JSON schema type"),
            )),
        }
    }

    fn object(&mut self, s: &'s Json, at: &str) -> Result<NodeId, SchemaError> {
        match s.get("additionalProperties") {
            None | Some(Json::Bool(_)) => {}
            Some(_) => {
                return Err(SchemaError::Unsupported {
                    keyword: "additionalProperties (a schema)".into(),
                    at: at.into(),
                })
            }
        }
        let required: Vec<&str> = match s.get("required") {
            None => Vec::new(),
            Some(r) => r
                .as_array()
                .and_then(|a| a.iter().map(Json::as_str).collect::<Option<Vec<_>>>())
                .ok_or_else(|| invalid(&format!("{at}/required"), "must be a list of names"))?,
        };
        let Some(props) = s.get("properties") else {
            if let Some(name) = required.first() {
                return Err(invalid(
                    at,
                    format!("`{name}` is required but no properties are listed"),
                ));
            }
            return Ok(ANY_OBJECT);
        };
        let props = props
            .as_object()
            .ok_or_else(|| invalid(&format!("{at}/properties"), "must be an object"))?;
        for name in &required {
            if !props.iter().any(|(k, _)| k == name) {
                return Err(invalid(
                    &format!("{at}/required"),
                    format!("`{name}` is required but not among the properties"),
                ));
            }
        }
        let mut out = Vec::with_capacity(props.len());
        for (i, (name, schema)) in props.iter().enumerate() {
            if props[..i].iter().any(|(k, _)| k == name) {
                return Err(invalid(
                    &format!("{at}/properties"),
                    format!("the property `{name}` is listed twice"),
                ));
            }
            let value = self.compile(schema, &format!("{at}/properties/{name}"))?;
            let key = quoted(name);
            self.literal_bytes += key.len();
            out.push(Prop {
                key,
                value,
                required: required.contains(&name.as_str()),
            });
        }
        self.add(Node::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> Result<Grammar, SchemaError> {
        Grammar::json_schema(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn unsupported_keywords_are_named_and_bad_schemas_refused() {
        let e = schema(r#"{"type":"string","pattern":"^a"}"#).unwrap_err();
        assert_eq!(
            e,
            SchemaError::Unsupported {
                keyword: "pattern".into(),
                at: "/".into()
            }
        );
        let e = schema(r#"{"type":"object","properties":{"a":{"type":"integer","minimum":0}}}"#)
            .unwrap_err();
        assert!(
            e.to_string().contains("`minimum` (at /properties/a)"),
            "{e}"
        );
        for bad in [
            r#"{"type":"object","required":["x"],"properties":{"a":{}}}"#,
            r#"{"type":"nope"}"#,
            r#"{"enum":[]}"#,
            r#"{"type":"string","minLength":3,"maxLength":2}"#,
            r##"{"$ref":"#/$defs/missing"}"##,
            r#"false"#,
            r#"{"type":"string","type":"integer"}"#,
        ] {
            assert!(
                matches!(schema(bad), Err(SchemaError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn recursive_references_compile_to_a_cycle() {
        let g = schema(
            r##"{"$defs":{"node":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}}}},
                "$ref":"#/$defs/node"}"##,
        )
        .unwrap();
        assert!(!g.nodes.iter().any(|n| matches!(n, Node::Pending)));
    }

    #[test]
    fn the_size_is_bounded() {
        let many: Vec<String> = (0..MAX_NODES + 1)
            .map(|i| format!(r#""p{i}":{{"type":"integer"}}"#))
            .collect();
        let text = format!(r#"{{"type":"object","properties":{{{}}}}}"#, many.join(","));
        assert!(matches!(
            schema(&text),
            Err(SchemaError::TooLarge { what: "nodes", .. })
        ));
    }
}
