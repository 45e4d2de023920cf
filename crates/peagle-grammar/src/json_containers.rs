//! JSON objects' and arrays' grammars from their schemas (`properties`, `required`,
//! `additionalProperties`; `items`, `prefixItems`, `minItems`, `maxItems`): the containers of
//! `json_schema`'s compiler, whitespace around every comma and colon.

use super::{count, err, json_text, JsonCompiler};
use crate::error::GrammarError;
use crate::grammar::{complement, Element, GrammarBuilder, Seq};
use serde_json::{Map, Value};

impl JsonCompiler<'_> {
    pub(super) fn object(&mut self, object: &Map<String, Value>, path: &str) -> Result<Element, GrammarError> {
        let empty = Map::new();
        let properties = match object.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(err(path, "properties must be an object")),
        };
        let required: Vec<&str> = match object.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| n.as_str().ok_or_else(|| err(path, "required must list strings")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(err(path, "required must be an array")),
        };
        if let Some(missing) = required.iter().find(|n| !properties.contains_key(**n)) {
            return Err(err(path, format!("required property {missing:?} is not in properties")));
        }
        let extra = match object.get("additionalProperties") {
            None if properties.is_empty() => Some(self.any_value()?),
            None | Some(Value::Bool(false)) => None,
            Some(schema) => Some(self.schema(schema, &format!("{path}/additionalProperties"))?),
        };
        let mut members = Vec::new();
        for (name, schema) in properties {
            let value = self.schema(schema, &format!("{path}/properties/{name}"))?;
            members.push((self.named_member(name, value)?, required.contains(&name.as_str())));
        }
        // Other members after the listed ones, as one optional "member": the first without
        // a comma before it. Their names are none of the listed ones, so that no listed member
        // comes twice (with a value its schema need not allow).
        if let Some(value) = extra {
            let key = match properties.is_empty() {
                true => self.primitive("string")?,
                false => {
                    let listed: Vec<&str> = properties.keys().map(String::as_str).collect();
                    self.other_name(&listed)?
                }
            };
            let member = self.member(vec![key], value)?;
            let comma_member = self.comma(member);
            let more = self.b.star(comma_member)?;
            members.push((self.b.unit(vec![member, more])?, false));
        }
        self.braced(&members)
    }

    /// Exactly `value`, whitespace allowed between its tokens as elsewhere; an object's
    /// members in its order.
    pub(super) fn value(&mut self, value: &Value) -> Result<Element, GrammarError> {
        match value {
            Value::Object(members) => {
                let mut all = Vec::new();
                for (name, member) in members {
                    let member = self.value(member)?;
                    all.push((self.named_member(name, member)?, true));
                }
                self.braced(&all)
            }
            Value::Array(elements) => {
                let items = elements.iter().map(|e| self.value(e)).collect::<Result<Vec<_>, _>>()?;
                let seq = self.items(&items, None)?;
                self.b.unit(seq)
            }
            scalar => self.b.unit(GrammarBuilder::literal(json_text(scalar).as_bytes())),
        }
    }

    /// `{ members }` (`members` as `members` takes them).
    fn braced(&mut self, members: &[(Element, bool)]) -> Result<Element, GrammarError> {
        let mut seq = GrammarBuilder::literal(b"{");
        seq.push(self.ws);
        seq.extend(self.members(members)?);
        seq.extend(GrammarBuilder::literal(b"}"));
        self.b.unit(seq)
    }

    /// The member `name` (its JSON text) with `value`.
    fn named_member(&mut self, name: &str, value: Element) -> Result<Element, GrammarError> {
        let key = GrammarBuilder::literal(json_text(&Value::String(name.to_string())).as_bytes());
        self.member(key, value)
    }

    /// A member name (a JSON string, quotes included) that is none of `listed`, each of its
    /// characters spelled one way only, as serde_json writes it (raw; `\"`, `\\` and the short
    /// escapes; `\u00xx` in lower case for the other control characters), so that no other
    /// spelling of a listed name gets past: the names as a trie of characters, and any
    /// character off the trie freeing the rest.
    fn other_name(&mut self, listed: &[&str]) -> Result<Element, GrammarError> {
        let mut children: Vec<Vec<(char, usize)>> = vec![Vec::new()];
        let mut ends = vec![false];
        for name in listed {
            let mut node = 0;
            for c in name.chars() {
                node = match children[node].iter().find(|child| child.0 == c) {
                    Some(&(_, child)) => child,
                    None => {
                        let child = children.len();
                        children.push(Vec::new());
                        ends.push(false);
                        children[node].push((c, child));
                        child
                    }
                };
            }
            ends[node] = true;
        }
        let quote = GrammarBuilder::literal(b"\"");
        let any_char = self.name_char(&[])?;
        let mut rest = vec![self.b.star(vec![any_char])?];
        rest.extend(quote.iter().copied());
        let rest = self.b.unit(rest)?;
        // A rule per node, children first: they were made after their parents.
        let mut rules: Vec<Option<Element>> = vec![None; children.len()];
        for node in (0..children.len()).rev() {
            let mut alternatives: Vec<Seq> = children[node]
                .iter()
                .map(|&(c, child)| {
                    let mut seq = GrammarBuilder::literal(spelling(c).as_bytes());
                    seq.extend(rules[child]);
                    seq
                })
                .collect();
            let taken: Vec<char> = children[node].iter().map(|child| child.0).collect();
            alternatives.push(vec![self.name_char(&taken)?, rest]);
            if !ends[node] {
                alternatives.push(quote.clone());
            }
            rules[node] = Some(self.b.rule(alternatives)?);
        }
        let mut seq = quote;
        seq.extend(rules[0]);
        self.b.unit(seq)
    }

    /// One character of a member name but those in `except`, spelled as `other_name` says.
    fn name_char(&mut self, except: &[char]) -> Result<Element, GrammarError> {
        let escaped: Vec<char> = (0..0x20u8).map(char::from).chain(['"', '\\']).collect();
        let raw = complement(escaped.iter().chain(except).map(|&c| (c, c)).collect());
        let spellings: Vec<String> = escaped
            .into_iter()
            .filter(|c| !except.contains(c))
            .map(spelling)
            .collect();
        let spellings: Vec<&[u8]> = spellings.iter().map(|s| s.as_bytes()).collect();
        let mut alternatives = vec![vec![self.b.chars(&raw)?]];
        // `one_of` of nothing would match the empty text: where names take every escaped
        // character here, there is no escaped alternative.
        if !spellings.is_empty() {
            alternatives.push(vec![self.b.one_of(&spellings)?]);
        }
        self.b.rule(alternatives)
    }

    /// `"key": value` with whitespace around the colon.
    pub(super) fn member(&mut self, key: Seq, value: Element) -> Result<Element, GrammarError> {
        let mut seq = key;
        seq.push(self.ws);
        seq.extend(GrammarBuilder::literal(b":"));
        seq.extend([self.ws, value]);
        self.b.unit(seq)
    }

    /// `, element` with whitespace before and after the comma.
    pub(super) fn comma(&self, element: Element) -> Seq {
        let mut seq = vec![self.ws];
        seq.extend(GrammarBuilder::literal(b","));
        seq.extend([self.ws, element]);
        seq
    }

    /// The members in order, each present if required (true) or possibly left out, separated
    /// by commas, then the whitespace before the closing brace when any is present.
    fn members(&mut self, members: &[(Element, bool)]) -> Result<Seq, GrammarError> {
        // first[i]: the members from i on when none came before; after: with one before.
        let mut first: Vec<Seq> = vec![Vec::new(); members.len() + 1];
        let mut after: Seq = Vec::new();
        for (i, &(member, required)) in members.iter().enumerate().rev() {
            let mut present = vec![member];
            present.extend(after.iter().copied());
            present.push(self.ws);
            first[i] = if required {
                present
            } else {
                let skipped = first[i + 1].clone();
                vec![self.b.rule(vec![present, skipped])?]
            };
            let comma_member = self.comma(member);
            after = if required {
                let mut seq = comma_member;
                seq.extend(after);
                seq
            } else {
                let mut seq = vec![self.b.optional(comma_member)?];
                seq.extend(after);
                seq
            };
            after = vec![self.b.unit(after)?];
        }
        Ok(first.swap_remove(0))
    }

    pub(super) fn array(&mut self, object: &Map<String, Value>, path: &str) -> Result<Element, GrammarError> {
        let min = count(object, "minItems", path)?.unwrap_or(0);
        let max = count(object, "maxItems", path)?;
        if max.is_some_and(|max| max < min) {
            return Err(err(path, "maxItems is less than minItems"));
        }
        let prefix = match object.get("prefixItems") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, s)| self.schema(s, &format!("{path}/prefixItems/{i}")))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(err(path, "prefixItems must be an array")),
        };
        let rest = match object.get("items") {
            Some(Value::Bool(false)) => None,
            None => Some(self.any_value()?),
            Some(schema) => Some(self.schema(schema, &format!("{path}/items"))?),
        };
        // One alternative per count of prefix items present; rest items only after them all.
        let within = |n: usize| n as u32 >= min && max.is_none_or(|m| n as u32 <= m);
        let mut alternatives = Vec::new();
        for n in 0..prefix.len() {
            if within(n) {
                alternatives.push(self.items(&prefix[..n], None)?);
            }
        }
        let p = prefix.len() as u32;
        match rest {
            Some(item) if max.is_none_or(|m| m >= p) => {
                let counts = (min.saturating_sub(p), max.map(|m| m - p));
                alternatives.push(self.items(&prefix, Some((item, counts.0, counts.1)))?);
            }
            _ if within(prefix.len()) => alternatives.push(self.items(&prefix, None)?),
            _ => {}
        }
        if alternatives.is_empty() {
            return Err(err(path, "no item count satisfies minItems, maxItems and the items"));
        }
        self.b.rule(alternatives)
    }

    /// `[ items ]`: `prefix`, then `rest.0` between `rest.1` and `rest.2` times.
    fn items(&mut self, prefix: &[Element], rest: Option<(Element, u32, Option<u32>)>) -> Result<Seq, GrammarError> {
        let mut content = Vec::new();
        for (i, &item) in prefix.iter().enumerate() {
            match i {
                0 => content.push(item),
                _ => content.extend(self.comma(item)),
            }
        }
        let mut may_be_empty = prefix.is_empty();
        if let Some((item, min, max)) = rest.filter(|r| r.2 != Some(0)) {
            let more = self.comma(item);
            if prefix.is_empty() {
                // The first has no comma before it.
                content.push(item);
                content.extend(self.b.repeat(more, min.saturating_sub(1), max.map(|m| m - 1))?);
                may_be_empty = min == 0;
            } else {
                content.extend(self.b.repeat(more, min, max)?);
            }
        }
        let mut seq = GrammarBuilder::literal(b"[");
        seq.push(self.ws);
        if !content.is_empty() {
            content.push(self.ws);
            match may_be_empty {
                true => seq.push(self.b.optional(content)?),
                false => seq.extend(content),
            }
        }
        seq.extend(GrammarBuilder::literal(b"]"));
        Ok(seq)
    }
}

/// How serde_json writes `c` inside a string.
fn spelling(c: char) -> String {
    let quoted = json_text(&Value::String(c.to_string()));
    quoted[1..quoted.len() - 1].to_string()
}
