// Command gateway plays a conforming gateway's part in front of the endpoint picker, for the routing tests:
// no gateway data plane (Envoy) can be installed on the test machines, so this speaks the picker's real
// ext_proc gRPC interface (envoy.service.ext_proc.v3, the messages Envoy sends, as the extension's own
// integration tests do) and forwards each request over HTTP to the endpoint the picker chose.
//
// For each HTTP request: RequestHeaders then RequestBody (end of stream) to the picker; its answer names the
// endpoint (the x-gateway-destination-endpoint header mutation) and the body to send; an ImmediateResponse
// (the picker's 503 with no ready endpoint, 429 when shed, 400) is returned to the client as it is. The
// upstream answer (buffered, at most 8 MiB) goes back through the picker (ResponseHeaders, ResponseBody) so it
// accounts the request as complete, then to the client, with the chosen endpoint in the
// x-gateway-destination-endpoint response header.
//
// -hold D: while the picker answers 503 (no endpoint: the pool is scaled to zero), ask again every
// -retry-interval until D has passed, then answer the picker's 503: the client's request is held at the
// gateway meanwhile (what a gateway's retry policy or a client's retries give; the time from the picker's first
// 503 to its answer is in the x-gateway-held-ms response header, 0 when it had an endpoint at once). 0: the 503
// at once. A connect failure to the endpoint (a pod the picker still listed is gone) is asked again too while
// the hold lasts, as a gateway's retry policy on connect-failure does.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	destinationHeader = "x-gateway-destination-endpoint"
	maxBody           = 8 << 20
)

var (
	listen        = flag.String("listen", "127.0.0.1:8080", "address the gateway listens on")
	picker        = flag.String("picker", "127.0.0.1:9002", "the endpoint picker's ext_proc gRPC address")
	hold          = flag.Duration("hold", 0, "how long to hold a request while the picker has no endpoint (503)")
	retryInterval = flag.Duration("retry-interval", 500*time.Millisecond, "how often to ask again while holding")
	useTLS        = flag.Bool("tls", false, "TLS to the picker without verifying its certificate (the picker's "+
		"--secure-serving default serves a self-signed one; gateways connect to it so)")
	timeout = flag.Duration("timeout", 300*time.Second, "deadline of one request, upstream included")
)

// decision is the picker's answer to one request: an endpoint and the body to send, or an immediate response.
type decision struct {
	endpoint  string
	body      []byte
	immediate *extproc.ImmediateResponse
	stream    extproc.ExternalProcessor_ProcessClient
}

func headerMap(pairs map[string]string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for k, v := range pairs {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return hm
}

// pick sends the request's headers and body to the picker on a new stream and reads its decision.
func pick(ctx context.Context, client extproc.ExternalProcessorClient, r *http.Request, body []byte) (*decision, error) {
	stream, err := client.Process(ctx)
	if err != nil {
		return nil, err
	}
	headers := map[string]string{":method": r.Method, ":path": r.URL.RequestURI(), ":authority": r.Host,
		"content-type": r.Header.Get("Content-Type"), "content-length": strconv.Itoa(len(body))}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		headers["x-request-id"] = id
	}
	msgs := []*extproc.ProcessingRequest{
		{Request: &extproc.ProcessingRequest_RequestHeaders{RequestHeaders: &extproc.HttpHeaders{Headers: headerMap(headers)}}},
		{Request: &extproc.ProcessingRequest_RequestBody{RequestBody: &extproc.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			return nil, err
		}
	}
	d := &decision{stream: stream}
	var newBody bytes.Buffer
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("picker: %w", err)
		}
		switch v := resp.Response.(type) {
		case *extproc.ProcessingResponse_ImmediateResponse:
			d.immediate = v.ImmediateResponse
			return d, nil
		case *extproc.ProcessingResponse_RequestHeaders:
			for _, h := range v.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if strings.EqualFold(h.GetHeader().GetKey(), destinationHeader) {
					d.endpoint = string(h.GetHeader().GetRawValue()) + h.GetHeader().GetValue()
				}
			}
		case *extproc.ProcessingResponse_RequestBody:
			mut := v.RequestBody.GetResponse().GetBodyMutation()
			if s := mut.GetStreamedResponse(); s != nil {
				newBody.Write(s.GetBody())
				if s.GetEndOfStream() {
					d.body = newBody.Bytes()
					return d, nil
				}
			} else {
				d.body = body
				if b := mut.GetBody(); b != nil {
					d.body = b
				}
				return d, nil
			}
		}
	}
}

// finish passes the upstream answer through the picker (so it counts the request as complete).
func finish(d *decision, status int, contentType string, body []byte) {
	msgs := []*extproc.ProcessingRequest{
		{Request: &extproc.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extproc.HttpHeaders{
			Headers: headerMap(map[string]string{":status": strconv.Itoa(status), "content-type": contentType})}}},
		{Request: &extproc.ProcessingRequest_ResponseBody{ResponseBody: &extproc.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := d.stream.Send(m); err != nil {
			break
		}
	}
	for {
		resp, err := d.stream.Recv()
		if err != nil {
			break
		}
		if b, ok := resp.Response.(*extproc.ProcessingResponse_ResponseBody); ok &&
			(b.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() ||
				b.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse() == nil) {
			break
		}
	}
	_ = d.stream.CloseSend()
}

// decide asks the picker, again every retryInterval while it answers 503 and the hold has not run out.
func decide(ctx context.Context, client extproc.ExternalProcessorClient, r *http.Request, body []byte) (*decision, time.Duration, error) {
	start := time.Now()
	var held time.Time // when the picker first had no endpoint: the hold's start
	since := func() time.Duration {
		if held.IsZero() {
			return 0
		}
		return time.Since(held)
	}
	for {
		d, err := pick(ctx, client, r, body)
		if err != nil {
			return nil, since(), err
		}
		unavailable := d.immediate != nil && d.immediate.GetStatus().GetCode() == 503
		if unavailable && held.IsZero() {
			held = time.Now()
		}
		if !unavailable || time.Since(start)+*retryInterval > *hold {
			return d, since(), nil
		}
		_ = d.stream.CloseSend()
		select {
		case <-ctx.Done():
			return nil, since(), ctx.Err()
		case <-time.After(*retryInterval):
		}
	}
}

func handler(client extproc.ExternalProcessorClient) http.HandlerFunc {
	upstream := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			http.Error(w, "request body unreadable or over 8 MiB", http.StatusRequestEntityTooLarge)
			return
		}
		start := time.Now()
		var d *decision
		var resp *http.Response
		var held time.Duration
		for {
			var err error
			d, held, err = decide(ctx, client, r, body)
			if err != nil {
				http.Error(w, "endpoint picker: "+err.Error(), http.StatusBadGateway)
				return
			}
			if d.immediate != nil || d.endpoint == "" {
				break
			}
			endpoint := strings.Split(d.endpoint, ",")[0]
			req, _ := http.NewRequestWithContext(ctx, r.Method, "http://"+endpoint+r.URL.RequestURI(), bytes.NewReader(d.body))
			req.Header.Set("Content-Type", r.Header.Get("Content-Type"))
			resp, err = upstream.Do(req)
			if err == nil {
				break
			}
			_ = d.stream.CloseSend()
			// A pod the picker still listed is gone (a connect failure): asked again while the hold lasts, as a
			// gateway's retry policy on connect-failure does.
			if time.Since(start)+*retryInterval > *hold {
				http.Error(w, "upstream "+endpoint+": "+err.Error(), http.StatusBadGateway)
				return
			}
			time.Sleep(*retryInterval)
		}
		w.Header().Set("x-gateway-held-ms", strconv.FormatInt(held.Milliseconds(), 10))
		if d.immediate != nil {
			_ = d.stream.CloseSend()
			code := int(d.immediate.GetStatus().GetCode())
			if code == 0 {
				code = http.StatusInternalServerError
			}
			w.WriteHeader(code)
			_, _ = w.Write(d.immediate.GetBody())
			return
		}
		if d.endpoint == "" {
			_ = d.stream.CloseSend()
			http.Error(w, "the endpoint picker named no endpoint", http.StatusBadGateway)
			return
		}
		endpoint := strings.Split(d.endpoint, ",")[0]
		defer resp.Body.Close()
		out, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil && !errors.Is(err, io.EOF) {
			_ = d.stream.CloseSend()
			http.Error(w, "upstream "+endpoint+": "+err.Error(), http.StatusBadGateway)
			return
		}
		finish(d, resp.StatusCode, resp.Header.Get("Content-Type"), out)
		w.Header().Set(destinationHeader, endpoint)
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	}
}

func main() {
	flag.Parse()
	creds := insecure.NewCredentials()
	if *useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // as gateways reach the picker
	}
	conn, err := grpc.NewClient(*picker, grpc.WithTransportCredentials(creds))
	if err != nil {
		log.Fatalf("gateway: %v", err)
	}
	defer conn.Close()
	srv := &http.Server{Handler: handler(extproc.NewExternalProcessorClient(conn)), ReadHeaderTimeout: 10 * time.Second}
	// Bound before it says so: the test bed waits for this line, not for a connection to the port (which
	// another process may hold).
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("gateway: %v", err)
	}
	log.Printf("gateway: listening on %s, endpoint picker at %s, hold %s", lis.Addr(), *picker, *hold)
	log.Fatal(srv.Serve(lis))
}
