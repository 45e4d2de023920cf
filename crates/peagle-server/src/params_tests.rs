//! The request fields' checks and their reading into a `ChoiceTemplate` (`params.rs`).

use super::*;
use std::collections::BTreeMap;

/// A tokenizer of one token a character, its code point.
fn chars(text: &str) -> Result<Vec<u32>, ApiError> {
    Ok(text.chars().map(u32::from).collect())
}

fn fields() -> SamplingRequest {
    SamplingRequest {
        seed: Some(7),
        n: Some(3),
        ..SamplingRequest::default()
    }
}

#[test]
fn choices_get_consecutive_seeds() {
    let template = fields().check(&SamplingDefaults::default(), chars).unwrap();
    let seeds: Vec<_> = (0..template.n)
        .map(|i| template.request(&[1], 4, None, i).params.sampling.seed)
        .collect();
    assert_eq!(seeds, vec![Some(7), Some(8), Some(9)]);
    let r = template.request(&[1], 4, None, 0);
    assert_eq!((r.params.sampling.temperature, r.speculate), (1.0, true));
    assert!(r.params.sampling.penalties.is_off());
}

#[test]
fn penalties_and_stop_tokens_reach_the_engine_request() {
    let template = SamplingRequest {
        presence_penalty: Some(0.5),
        frequency_penalty: Some(-1.0),
        repetition_penalty: Some(1.3),
        logit_bias: Some(BTreeMap::from([("5".into(), -100.0), ("42".into(), 2.5)])),
        min_p: Some(0.1),
        min_tokens: Some(3),
        stop_token_ids: Some(vec![9, 11]),
        ..fields()
    }
    .check(&SamplingDefaults::default(), chars)
    .unwrap();
    let params = template.request(&[1], 4, None, 0).params;
    assert_eq!(
        params.sampling.penalties,
        Penalties {
            presence: 0.5,
            frequency: -1.0,
            repetition: 1.3,
            logit_bias: vec![(42, 2.5), (5, -100.0)],
        }
    );
    assert_eq!(params.sampling.min_p, 0.1);
    assert_eq!((params.min_tokens, params.stop_token_ids), (3, vec![9, 11]));
    assert_eq!(template.budget(Some(3), "max_tokens", 16, 1, 100).unwrap(), 3);
    let err = template.budget(Some(2), "max_tokens", 16, 1, 100).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("min_tokens"));
}

/// Fields that cannot be read as the engine's name themselves; the ranges of the others
/// are the engine's to check (the API tests send each out of range).
#[test]
fn unreadable_fields_name_the_param() {
    let bad = |f: SamplingRequest| f.check(&SamplingDefaults::default(), chars).unwrap_err().param.unwrap();
    let cases = [
        (
            "n",
            SamplingRequest {
                n: Some(17),
                ..fields()
            },
        ),
        ("n", SamplingRequest { n: Some(0), ..fields() }),
        (
            "top_k",
            SamplingRequest {
                top_k: Some(-2),
                ..fields()
            },
        ),
        (
            "logit_bias",
            SamplingRequest {
                logit_bias: Some(BTreeMap::from([("abc".to_string(), 1.0)])),
                ..fields()
            },
        ),
        (
            "min_tokens",
            SamplingRequest {
                min_tokens: Some(-1),
                ..fields()
            },
        ),
    ];
    for (param, request) in cases {
        assert_eq!(bad(request), param);
    }
}

#[test]
fn the_models_defaults_fill_what_the_request_leaves_out() {
    let defaults = SamplingDefaults {
        temperature: Some(0.6),
        top_p: Some(0.9),
        top_k: Some(20),
        min_p: Some(0.05),
        repetition_penalty: Some(1.1),
        max_new_tokens: Some(32),
    };
    let template = fields().check(&defaults, chars).unwrap();
    let sampling = template.request(&[1], 4, None, 0).params.sampling;
    assert_eq!(
        (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p),
        (0.6, 0.9, 20, 0.05)
    );
    assert_eq!(sampling.penalties.repetition, 1.1);
    // max_new_tokens caps the default and an explicit max_tokens alike (vLLM's rule).
    assert_eq!(template.budget(None, "max_tokens", usize::MAX, 10, 100).unwrap(), 32);
    assert_eq!(template.budget(Some(50), "max_tokens", 16, 10, 100).unwrap(), 32);
    assert_eq!(template.budget(Some(8), "max_tokens", 16, 10, 100).unwrap(), 8);
    let explicit = SamplingRequest {
        temperature: Some(0.0),
        top_k: Some(-1),
        ..fields()
    };
    let sampling = explicit
        .check(&defaults, chars)
        .unwrap()
        .request(&[1], 4, None, 0)
        .params
        .sampling;
    assert_eq!((sampling.temperature, sampling.top_k), (0.0, 0));
}

#[test]
fn budgets_fit_the_context() {
    let template = fields().check(&SamplingDefaults::default(), chars).unwrap();
    let max_tokens = |requested, prompt_len| template.budget(requested, "max_tokens", 16, prompt_len, 100);
    assert_eq!(max_tokens(None, 10).unwrap(), 16);
    assert_eq!(max_tokens(None, 95).unwrap(), 5);
    assert_eq!(max_tokens(Some(90), 10).unwrap(), 90);
    assert!(max_tokens(Some(91), 10).is_err());
    assert!(max_tokens(Some(0), 10).is_err());
    let huge = format!("{:?}", max_tokens(Some(i64::MAX), 10).unwrap_err());
    assert!(huge.contains("you requested 9223372036854775817 tokens"), "{huge}");
    assert!(check_prompt(0, 100, "prompt").is_err());
    assert!(check_prompt(100, 100, "prompt").is_err());
    assert!(check_prompt(99, 100, "prompt").is_ok());
}
