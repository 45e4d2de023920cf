//! `--enable-request-id-headers`, as in vLLM: every response carries an `X-Request-Id`, the
//! client's own or a new one. A new one is also put on the request, so that a completion's id
//! (`cmpl-<id>`) names the same request as the header.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub async fn request_id_header(mut req: Request, next: Next) -> Response {
    let id = match req.headers().get(&X_REQUEST_ID).filter(|id| !id.is_empty()) {
        Some(id) => id.clone(),
        None => {
            let id = HeaderValue::from_str(&format!("{:032x}", rand::random::<u128>()))
                .expect("hex digits are a valid header value");
            req.headers_mut().insert(X_REQUEST_ID, id.clone());
            id
        }
    };
    let mut response = next.run(req).await;
    response.headers_mut().insert(X_REQUEST_ID, id);
    response
}
