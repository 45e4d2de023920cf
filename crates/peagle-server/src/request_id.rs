//! `--enable-request-id-headers`, as in vLLM: every response carries an `X-Request-Id`, the
//! client's own or a new one. A new one is also put on the request, so that a completion's id
//! (`cmpl-<id>`) names the same request as the header.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use crate::protocol::{client_request_id, random_id};

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub async fn request_id_header(mut req: Request, next: Next) -> Response {
    let id = match client_request_id(req.headers()) {
        Some(id) => id.to_owned(),
        None => {
            let id = random_id();
            req.headers_mut().insert(X_REQUEST_ID, header_value(&id));
            id
        }
    };
    let mut response = next.run(req).await;
    response.headers_mut().insert(X_REQUEST_ID, header_value(&id));
    response
}

/// A client's id came from a header, and a new one is hex digits: either is a valid value.
fn header_value(id: &str) -> HeaderValue {
    HeaderValue::from_str(id).expect("a header's text or hex digits")
}
