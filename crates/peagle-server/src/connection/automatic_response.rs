//! hyper answers a request it cannot parse (a bad request line or header, a URI or header
//! section too long) itself, before the app sees it, with a bare status and an empty body.
//! OpenAI clients expect every error as a JSON object, so the connection rewrites those
//! responses on their way out. They are recognisable by their shape: every response of the
//! app carries a content type, and hyper's automatic ones never do.

use crate::error::ApiError;
use axum::http::StatusCode;

/// The JSON version of `head` when it is one of hyper's automatic error responses: the whole
/// head of a 4xx or 5xx with `content-length: 0`, no content type and nothing after it.
pub fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let status_line = text.strip_suffix("\r\n\r\n")?.lines().next()?;
    let code: u16 = status_line.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let status = StatusCode::from_u16(code).ok()?;
    let headers: Vec<&str> = text.lines().skip(1).filter(|l| !l.is_empty()).collect();
    let has = |name: &str| headers.iter().any(|h| h.to_ascii_lowercase().starts_with(name));
    let bodyless = headers.iter().any(|h| h.eq_ignore_ascii_case("content-length: 0"));
    if !(status.is_client_error() || status.is_server_error()) || !bodyless || has("content-type:") {
        return None;
    }
    let error = ApiError::client(status, code_name(status), message(status));
    let body = error.body().to_string();
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for header in headers
        .iter()
        .filter(|h| !h.to_ascii_lowercase().starts_with("content-length:"))
    {
        out.push_str(header);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    out.push_str(&body);
    Some(out.into_bytes())
}

fn code_name(status: StatusCode) -> &'static str {
    match status {
        StatusCode::URI_TOO_LONG => "uri_too_long",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "headers_too_large",
        _ => "malformed_request",
    }
}

fn message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::URI_TOO_LONG => "the request URI is too long",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "the request headers are too large",
        _ => "the request is not valid HTTP/1.1 (request line or headers)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_bare_error_becomes_a_json_error() {
        let head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Wed, 25 Nov 2026 07:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(head).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("date: Wed"));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "malformed_request");
    }

    #[test]
    fn the_apps_responses_pass_untouched() {
        let json = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(rewrite(json), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(rewrite(ok), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nx";
        assert_eq!(rewrite(with_body), None);
    }
}
