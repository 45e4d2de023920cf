//! A connection's socket as hyper sees it: reads mark the connection active (for the
//! keep-alive timeout and for shedding), and hyper's automatic error responses are rewritten
//! as JSON errors on the way out.

use super::automatic_response;
use super::registry::Slot;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub struct ConnIo {
    stream: TcpStream,
    slot: Arc<Slot>,
    /// A rewritten response still being written, and how many bytes of hyper's buffer it
    /// stands for (reported written once it is all out).
    rewritten: Vec<u8>,
    stands_for: usize,
}

impl ConnIo {
    pub fn new(stream: TcpStream, slot: Arc<Slot>) -> Self {
        Self {
            stream,
            slot,
            rewritten: Vec::new(),
            stands_for: 0,
        }
    }

    fn write_rewritten(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while !self.rewritten.is_empty() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.rewritten))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.rewritten.drain(..n);
        }
        Poll::Ready(Ok(self.stands_for))
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.slot.touch();
        }
        Poll::Ready(Ok(()))
    }
}

/// Not vectored: hyper then hands over each response head whole in one buffer, which is what
/// the rewrite looks at.
impl AsyncWrite for ConnIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.rewritten.is_empty() {
            match automatic_response::rewrite(buf) {
                Some(rewritten) => {
                    self.rewritten = rewritten;
                    self.stands_for = buf.len();
                }
                None => return Pin::new(&mut self.stream).poll_write(cx, buf),
            }
        }
        self.write_rewritten(cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.write_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.write_rewritten(cx))?;
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
