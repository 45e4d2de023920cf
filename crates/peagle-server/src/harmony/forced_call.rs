//! A harmony chat forced to call (`tool_choice` "required" or a named function). The answer
//! may reason first, in analysis messages, and is then one call of a forced function as
//! harmony writes a call, its arguments held to the function's parameters:
//! `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGUMENTS`, or with
//! the recipient in the header, ` to=functions.NAME<|channel|>commentary json<|message|>...`
//! (the content type as ` <|constrain|>json`, ` json` or left out, as the model writes it). The structure holds the answer from its first
//! token, so the reasoning is the model's own and the call is sure. It ends with the
//! arguments, where only a stop token may follow (the model's is `<|call|>`): a structure
//! that named the stop token would have it held back before `min_tokens` like any other,
//! and then ban every token.

use super::Harmony;
use crate::protocol::tools::{FunctionDefinition, ToolChoice};
use peagle_grammar::{Format, Spec};

impl Harmony {
    /// What the answer of a chat that `choice` forces to call one of `tools` follows; None
    /// where no call is forced.
    pub fn forced_call(&self, choice: &ToolChoice, tools: &[FunctionDefinition]) -> Option<Spec> {
        let forced = choice.forced(tools);
        if forced.is_empty() {
            return None;
        }
        let ids = &self.syntax;
        let analysis = Format::Sequence(vec![
            Format::token(ids.channel),
            Format::text("analysis"),
            Format::token(ids.message),
            Format::any_text(),
            Format::token(ids.end),
            Format::token(ids.start),
            Format::text("assistant"),
        ]);
        // The arguments' content type, as the model may write it (or leave it out).
        let json = Format::Or(vec![
            Format::Sequence(vec![
                Format::text(" "),
                Format::token(ids.constrain),
                Format::text("json"),
            ]),
            Format::text(" json"),
            Format::text(""),
        ]);
        // A call of `f`: its name, the rest of the header, its arguments.
        let call = |f: &&FunctionDefinition, header: &[Format]| {
            let mut parts = vec![Format::text(&f.name)];
            parts.extend_from_slice(header);
            parts.extend([Format::token(ids.message), Format::Json(f.arguments_schema())]);
            Format::Sequence(parts)
        };
        // The recipient after the channel, or in the header before it.
        let on_channel = forced.iter().map(|f| call(f, std::slice::from_ref(&json))).collect();
        let in_header_rest = [Format::token(ids.channel), Format::text("commentary"), json];
        let in_header = forced.iter().map(|f| call(f, &in_header_rest)).collect();
        Some(Spec::Structure(Format::Sequence(vec![
            analysis.star(),
            Format::Or(vec![
                Format::Sequence(vec![
                    Format::token(ids.channel),
                    Format::text("commentary to=functions."),
                    Format::Or(on_channel),
                ]),
                Format::Sequence(vec![Format::text(" to=functions."), Format::Or(in_header)]),
            ]),
        ])))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Syntax;
    use super::*;
    use peagle_grammar::{Grammar, Literal, Vocabulary};
    use serde_json::json;

    const START: u32 = 1;
    const END: u32 = 2;
    const MESSAGE: u32 = 3;
    const CHANNEL: u32 = 4;
    const CONSTRAIN: u32 = 5;

    fn harmony() -> Harmony {
        Harmony {
            stop_token_ids: vec![6, 7],
            syntax: Syntax {
                start: START,
                end: END,
                message: MESSAGE,
                channel: CHANNEL,
                constrain: CONSTRAIN,
            },
        }
    }

    fn tools() -> Vec<FunctionDefinition> {
        let weather = json!({"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                             "required": ["city"], "additionalProperties": false});
        vec![
            FunctionDefinition {
                name: "get_weather".into(),
                description: None,
                parameters: Some(weather),
                strict: None,
            },
            FunctionDefinition {
                name: "get_time".into(),
                description: None,
                parameters: None,
                strict: None,
            },
        ]
    }

    fn grammar(choice: ToolChoice) -> Grammar {
        harmony()
            .forced_call(&choice, &tools())
            .unwrap()
            .compile(&Vocabulary::new(Vec::new()))
            .unwrap()
    }

    /// `text` with `<|start|>`, `<|end|>`, `<|message|>`, `<|channel|>` and `<|constrain|>`
    /// spelled as the special tokens above.
    fn spelled(text: &str) -> Vec<u8> {
        let names = [
            ("<|start|>", START),
            ("<|end|>", END),
            ("<|message|>", MESSAGE),
            ("<|channel|>", CHANNEL),
            ("<|constrain|>", CONSTRAIN),
        ];
        Literal::named(text, &names).bytes()
    }

    fn whole(g: &Grammar, text: &str) -> bool {
        g.advance_bytes(&g.start(), &spelled(text)).accepts()
    }

    #[test]
    fn a_forced_answer_reasons_then_calls_in_either_header_form() {
        let named = grammar(ToolChoice::Named("get_weather".into()));
        let analysis = "<|channel|>analysis<|message|>Cold? 日本<|end|><|start|>assistant";
        for call in [
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}",
            "<|channel|>commentary to=functions.get_weather json<|message|>{\"city\": \"Rome\"}",
            "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Oslo\"}",
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}",
            " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Oslo\"}",
        ] {
            for reasoning in ["", analysis, &analysis.repeat(2)] {
                let text = format!("{reasoning}{call}");
                assert!(whole(&named, &text), "{text}");
            }
        }
        let end = named.advance_bytes(
            &named.start(),
            &spelled(&format!(
                "{analysis} to=functions.get_weather<|message|>{{\"city\":\"Oslo\"}}"
            )),
        );
        assert!(end.is_dead(), "the header form names the channel");
        for not_a_call in [
            "<|channel|>final<|message|>{\"city\":\"Oslo\"}",
            "<|channel|>commentary<|message|>Let me look.",
            "<|channel|>commentary to=functions.get_time<|message|>{}",
            "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Paris\"}",
            "<|channel|>analysis<|message|>no end<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Oslo\"}",
            "<|channel|>analysis<|message|>a <|start|> inside<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Oslo\"}",
        ] {
            assert!(!whole(&named, not_a_call), "{not_a_call}");
        }
    }

    #[test]
    fn required_calls_any_offered_function_with_its_arguments() {
        let required = grammar(ToolChoice::Required);
        assert!(whole(
            &required,
            "<|channel|>commentary to=functions.get_time<|message|>{\"zone\": \"CET\"}"
        ));
        assert!(whole(
            &required,
            " to=functions.get_weather<|channel|>commentary<|message|>{\"city\":\"Rome\"}"
        ));
        assert!(!whole(
            &required,
            "<|channel|>commentary to=functions.get_time<|message|>[]"
        ));
        assert!(!whole(
            &required,
            "<|channel|>commentary to=functions.get_weather<|message|>{}"
        ));
        assert!(harmony().forced_call(&ToolChoice::Auto, &tools()).is_none());
        assert!(harmony().forced_call(&ToolChoice::None, &tools()).is_none());
    }
}
