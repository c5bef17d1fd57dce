package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// What --get prints: one download on one connection (the bulk table's independent row).
type getReport struct {
	Client string `json:"client"`
	Status int    `json:"status"`
	Bytes  int64  `json:"bytes"`
	// From the request to the body's last byte (the handshake before it not counted).
	Seconds   float64 `json:"seconds"`
	ClientCPU float64 `json:"client_cpu_s"`
	// The QUIC connection's packets (HTTP/3 only): its acknowledgements per data packet.
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
}

// getOnce downloads path from server over proto on one connection, within timeout, and prints
// a getReport; the exit status is 1 if the download could not be made or read to its end (the
// caller judges the status and the length).
func getOnce(server, path, proto string, timeout time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "udpx-quicgo-load: %s: %v\n", what, err)
		return 1
	}
	cpu0 := cpuSeconds()
	tlsConf := &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"}
	rep := getReport{Client: "quic-go " + quicGoVersion()}
	var rt http.RoundTripper
	var packets func() (uint64, uint64)
	switch proto {
	case "h3":
		addr, err := net.ResolveUDPAddr("udp", server)
		if err != nil {
			return fail("resolve", err)
		}
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return fail("socket", err)
		}
		tr := &quic.Transport{Conn: c}
		defer tr.Close()
		tlsConf.NextProtos = []string{http3.NextProtoH3}
		conn, err := tr.Dial(ctx, addr, tlsConf, &quic.Config{MaxIdleTimeout: 30 * time.Second})
		if err != nil {
			return fail("handshake", err)
		}
		defer func() { _ = conn.CloseWithError(0, "") }()
		rt = (&http3.Transport{}).NewClientConn(conn)
		packets = func() (uint64, uint64) {
			s := conn.ConnectionStats()
			return s.PacketsSent, s.PacketsReceived
		}
	default:
		rep.Client = "Go net/http " + proto
		h := &http.Transport{TLSClientConfig: tlsConf, ForceAttemptHTTP2: proto == "h2"}
		if proto == "http1.1" {
			h.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		defer h.CloseIdleConnections()
		rt = h
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+server+path, nil)
	req.Header.Set("User-Agent", "udpx-quicgo-load")
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return fail("request", err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep.Seconds = time.Since(start).Seconds()
	if err != nil {
		return fail(fmt.Sprintf("the body, after %d bytes", n), err)
	}
	rep.Status, rep.Bytes = resp.StatusCode, n
	if packets != nil {
		rep.PacketsSent, rep.PacketsReceived = packets()
	}
	rep.ClientCPU = cpuSeconds() - cpu0
	if err := json.NewEncoder(os.Stdout).Encode(&rep); err != nil {
		return 1
	}
	return 0
}
