// Package httpserve serves HTTP/1.1 with net/http's types and handlers,
// but runs each exchange start to finish on its connection's goroutine.
//
// net/http's Server is general: for every request it starts a goroutine
// that reads ahead on the connection (to notice a client that goes away),
// arms and disarms deadlines for it, and passes the response through two
// layers of buffered writers. On a request/response API with small bodies
// that is a large share of the server's work: against holdfast's agent at
// 32 clients, a Server from this package spends 9 % less CPU per KV PUT
// and 18 % less per ?consistent GET (bench/README.md, "HTTP server loop").
//
// What a connection does, in order:
//   - waits for the first byte of a request with no deadline (or
//     IdleTimeout), then gives the whole header ReadHeaderTimeout;
//   - parses it: a request of the usual shape, fully buffered, by a
//     parser of its own that gives what http.ReadRequest gives
//     (FuzzFastRequest checks it against ReadRequest), and anything else
//     by http.ReadRequest; refusing a header over
//     MaxHeaderBytes (431), an unparsable request (400), a missing Host on
//     HTTP/1.1 (400), another major version (505) and an Expect other than
//     100-continue (417);
//   - calls the handler. "100 Continue" is sent when the handler first
//     reads the body, as net/http does;
//   - buffers the response and writes it in one system call with its
//     Content-Length. A response that grows past 64 KiB is streamed in
//     chunks instead (HTTP/1.0 clients get it unframed, then a close),
//     closing the connection if the client takes none of it for
//     StreamStallTimeout;
//   - discards up to 256 KiB of body the handler left unread, and closes
//     the connection when more remains;
//   - keeps the connection for the next request unless the client or the
//     handler asked to close it, or the server is shutting down.
//
// The one thing it does not do on its own is watch for a client that goes
// away while its handler runs: that needs a read on the side, which is the
// cost this package exists to avoid. A handler that is about to wait for a
// long time (a blocking query) asks for it by calling WatchDisconnect on
// its ResponseWriter; from then on the request's context is cancelled if
// the client closes the connection. Under net/http's Server the method does
// not exist and the context is cancelled anyway, so a handler written as
//
//	if dw, ok := w.(interface{ WatchDisconnect() }); ok {
//		dw.WatchDisconnect()
//	}
//
// behaves the same under both.
//
// Not supported, because holdfast's API does not use them: http.Flusher,
// http.Hijacker, HTTP/2, TLS (serve a tls.Listener if needed, but ALPN
// is not negotiated) and trailers.
package httpserve
