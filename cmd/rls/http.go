package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// httpFlags registers the HTTP limits' flags on fs.
func httpFlags(fs *flag.FlagSet, l *server.HTTPLimits) {
	fs.DurationVar(&l.ReadHeaderTimeout, "http-read-header-timeout", l.ReadHeaderTimeout,
		"HTTP: longest a client may take to send a request's headers")
	fs.DurationVar(&l.ReadTimeout, "http-read-timeout", l.ReadTimeout,
		"HTTP: longest a client may take to send a whole request, body included")
	fs.DurationVar(&l.WriteTimeout, "http-write-timeout", l.WriteTimeout,
		"HTTP: longest from the end of a request's headers to the end of its answer (a client that reads slowly is cut off)")
	fs.DurationVar(&l.IdleTimeout, "http-idle-timeout", l.IdleTimeout,
		"HTTP: a keep-alive connection with no request for this long is closed")
	fs.IntVar(&l.MaxHeaderBytes, "http-max-header-bytes", l.MaxHeaderBytes,
		"HTTP: largest request line and headers accepted (larger: 431)")
}
