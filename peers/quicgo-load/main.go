// Command udpx-quicgo-load plays video players against an HTTP server, like `udpx h3 load`,
// on another stack: quic-go's HTTP/3 client (its acknowledgement policy untouched), or Go's
// own HTTP/2 and HTTP/1.1 client over TLS for the TCP servers. It is udpx's independent load
// client: the scale bench judges servers with it (see docs/bench.md).
//
// Player i connects at ramp*i/N, fetches the path, then asks again interval after it asked
// before (at once when late). Requests sent in the measured window (after the ramp, for
// duration) are counted; the run waits up to 10 s after the window for their answers. The
// report, one JSON object on stdout, has the fields of udpx's LoadReport and the packets the
// client sent and received over the window (acknowledgements per data packet). With --get it
// makes one download instead (get.go): the bulk table's independent row.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// Grace after the window for the window's requests to be answered.
const grace = 10 * time.Second

type latency struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	N   int     `json:"n"`
}

func latencyOf(us []int64) latency {
	if len(us) == 0 {
		return latency{}
	}
	sort.Slice(us, func(i, j int) bool { return us[i] < us[j] })
	at := func(q float64) float64 {
		i := int(float64(len(us)-1)*q + 0.5)
		return float64(us[i]) / 1e3
	}
	return latency{P50: at(0.5), P99: at(0.99), Max: at(1), N: len(us)}
}

type report struct {
	Client          string  `json:"client"`
	Established     int     `json:"established"`
	EndedEarly      int     `json:"ended_early"`
	NeverServed     int     `json:"never_served"`
	Requests        uint64  `json:"requests"`
	Served          uint64  `json:"served"`
	Failed          uint64  `json:"failed"`
	Late            uint64  `json:"late"`
	Unanswered      uint64  `json:"unanswered"`
	Bytes           uint64  `json:"bytes"`
	Latency         latency `json:"latency"`
	Handshake       latency `json:"handshake"`
	ClientCPU       float64 `json:"client_cpu_s"`
	Window          float64 `json:"window_s"`
	PacketsSent     uint64  `json:"packets_sent"`
	PacketsReceived uint64  `json:"packets_received"`
	// Datagrams the kernel delivered to this namespace's UDP sockets over the window
	// (/proc/net/snmp's Udp InDatagrams; the client runs alone in its namespace): the
	// datagrams quic-go took in but never processed (PacketsReceived counts processed ones)
	// are the difference, most of them dropped by its per-connection queue of unprocessed
	// packets when a connection's goroutine falls behind. -1: not read.
	UDPDelivered int64 `json:"udp_delivered"`
	// Datagrams the kernel dropped over the window because a socket's receive buffer was
	// full (RcvbufErrors; quic-go asks for 7 MiB, the machine's rmem_max caps it). -1: not read.
	UDPRcvbufErrors int64    `json:"udp_rcvbuf_errors"`
	Errors          []string `json:"errors"`
}

type tally struct {
	sync.Mutex
	r          report
	latencies  []int64
	handshakes []int64
	errors     map[string]int
}

func (t *tally) err(what string, e error) {
	t.Lock()
	defer t.Unlock()
	msg := what + ": " + e.Error()
	if len(msg) > 160 {
		msg = msg[:160]
	}
	t.errors[msg]++
}

type run struct {
	server      string
	path        string
	proto       string
	interval    time.Duration
	ramp        time.Duration
	duration    time.Duration
	keepalive   time.Duration
	size        int64
	start       time.Time
	windowStart time.Time
	windowEnd   time.Time
	stopAt      time.Time
	t           tally
	// The QUIC connections, for their packet counts.
	connsMu sync.Mutex
	conns   []*quic.Conn
}

func (r *run) inWindow(at time.Time) bool {
	return !at.Before(r.windowStart) && at.Before(r.windowEnd)
}

func main() {
	server := flag.String("server", "", "the server, ADDR:PORT")
	n := flag.Int("connections", 100, "players (one connection each)")
	path := flag.String("path", "/segment", "the path each request asks for")
	proto := flag.String("proto", "h3", "h3 (quic-go), h2 or http1.1 (Go's net/http over TLS)")
	interval := flag.Float64("interval", 2, "seconds between a player's requests; 0: idle connections")
	ramp := flag.Float64("ramp", 5, "seconds over which the players start")
	duration := flag.Float64("duration", 15, "the measured window, seconds (with --get: the download's time limit)")
	get := flag.Bool("get", false, "one download of --path on one connection instead of players: print its bytes, seconds and packets (get.go)")
	keepalive := flag.Float64("keepalive", 10, "an idle connection's PING period, seconds")
	locals := flag.String("locals", "", "local addresses to send from, comma-separated, round robin")
	size := flag.Int64("size", -1, "the body's length: a shorter or longer one fails (-1: any)")
	flag.Parse()
	if *server == "" || *n < 1 || *n > 1000000 || *duration <= 0 || !strings.HasPrefix(*path, "/") {
		fmt.Fprintln(os.Stderr, "udpx-quicgo-load: give --server ADDR:PORT, --connections 1 to 1000000, --duration > 0 and an absolute --path")
		os.Exit(2)
	}
	if *proto != "h3" && *proto != "h2" && *proto != "http1.1" {
		fmt.Fprintf(os.Stderr, "udpx-quicgo-load: --proto %s: give h3, h2 or http1.1\n", *proto)
		os.Exit(2)
	}
	if *get {
		os.Exit(getOnce(*server, *path, *proto, time.Duration(*duration*float64(time.Second))))
	}
	var ips []net.IP
	for _, s := range strings.Split(*locals, ",") {
		if s == "" {
			continue
		}
		ip := net.ParseIP(s)
		if ip == nil {
			fmt.Fprintf(os.Stderr, "udpx-quicgo-load: --locals: %q is not an address\n", s)
			os.Exit(2)
		}
		ips = append(ips, ip)
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	r := &run{
		server: *server, path: *path, proto: *proto, interval: secs(*interval), ramp: secs(*ramp),
		duration: secs(*duration), keepalive: secs(*keepalive), size: *size,
	}
	r.t.errors = map[string]int{}
	r.start = time.Now()
	r.windowStart = r.start.Add(r.ramp)
	r.windowEnd = r.windowStart.Add(r.duration)
	r.stopAt = r.windowEnd.Add(grace)

	// One UDP socket per local address, shared by its players' connections.
	var transports []*quic.Transport
	if r.proto == "h3" {
		if len(ips) == 0 {
			ips = []net.IP{nil}
		}
		for _, ip := range ips {
			c, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
			if err != nil {
				fmt.Fprintf(os.Stderr, "udpx-quicgo-load: a socket on %v: %v\n", ip, err)
				os.Exit(1)
			}
			transports = append(transports, &quic.Transport{Conn: c})
		}
	}

	var wg sync.WaitGroup
	for i := 0; i < *n; i++ {
		wg.Add(1)
		due := r.start.Add(time.Duration(float64(r.ramp) * float64(i) / float64(*n)))
		var local net.IP
		if len(ips) > 0 {
			local = ips[i%len(ips)]
		}
		var tr *quic.Transport
		if len(transports) > 0 {
			tr = transports[i%len(transports)]
		}
		go func() {
			defer wg.Done()
			r.player(due, local, tr)
		}()
	}

	// The window's CPU and packets.
	time.Sleep(time.Until(r.windowStart))
	cpu0 := cpuSeconds()
	sent0, recv0 := r.packets()
	udp0, rcvbuf0 := udpCounters()
	time.Sleep(time.Until(r.windowEnd))
	cpu1 := cpuSeconds()
	sent1, recv1 := r.packets()
	udp1, rcvbuf1 := udpCounters()
	wg.Wait()

	t := &r.t
	t.Lock()
	defer t.Unlock()
	t.r.Client = "quic-go " + quicGoVersion()
	if r.proto != "h3" {
		t.r.Client = "Go net/http " + r.proto
	}
	t.r.Latency = latencyOf(t.latencies)
	t.r.Handshake = latencyOf(t.handshakes)
	t.r.ClientCPU = cpu1 - cpu0
	t.r.Window = r.duration.Seconds()
	t.r.PacketsSent = sent1 - sent0
	t.r.PacketsReceived = recv1 - recv0
	t.r.UDPDelivered, t.r.UDPRcvbufErrors = -1, -1
	if udp0 >= 0 && udp1 >= udp0 {
		t.r.UDPDelivered = udp1 - udp0
	}
	if rcvbuf0 >= 0 && rcvbuf1 >= rcvbuf0 {
		t.r.UDPRcvbufErrors = rcvbuf1 - rcvbuf0
	}
	t.r.Unanswered = t.r.Requests - t.r.Served - t.r.Failed
	t.r.Errors = []string{}
	for e, k := range t.errors {
		t.r.Errors = append(t.r.Errors, fmt.Sprintf("%d x %s", k, e))
	}
	sort.Strings(t.r.Errors)
	if err := json.NewEncoder(os.Stdout).Encode(&t.r); err != nil {
		os.Exit(1)
	}
}

// The packets every QUIC connection sent and received so far (closed ones keep their counts).
func (r *run) packets() (sent, recv uint64) {
	r.connsMu.Lock()
	defer r.connsMu.Unlock()
	for _, c := range r.conns {
		s := c.ConnectionStats()
		sent += s.PacketsSent
		recv += s.PacketsReceived
	}
	return
}

// The kernel's UDP counters for this network namespace (/proc/net/snmp, "Udp:"): datagrams
// delivered to sockets (InDatagrams) and dropped for a full receive buffer (RcvbufErrors);
// -1, -1 when they cannot be read.
func udpCounters() (delivered, rcvbufErrors int64) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return -1, -1
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		delivered, rcvbufErrors = -1, -1
		for i, name := range names {
			var v int64
			if i >= len(f) {
				break
			}
			if _, err := fmt.Sscan(f[i], &v); err != nil {
				continue
			}
			switch name {
			case "InDatagrams":
				delivered = v
			case "RcvbufErrors":
				rcvbufErrors = v
			}
		}
		return delivered, rcvbufErrors
	}
	return -1, -1
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func quicGoVersion() string {
	// The module's version, as built (go.mod pins it).
	return "v0.65.0"
}

// One player: connect, then a request every interval until the window ends.
func (r *run) player(due time.Time, local net.IP, tr *quic.Transport) {
	time.Sleep(time.Until(due))
	ctx, cancel := context.WithDeadline(context.Background(), r.stopAt)
	defer cancel()
	started := time.Now()
	tlsConf := &tls.Config{InsecureSkipVerify: true, ServerName: "localhost"}
	var rt http.RoundTripper
	var closeConn func()
	established := func() {
		r.t.Lock()
		r.t.r.Established++
		r.t.handshakes = append(r.t.handshakes, time.Since(started).Microseconds())
		r.t.Unlock()
	}
	switch r.proto {
	case "h3":
		addr, err := net.ResolveUDPAddr("udp", r.server)
		if err != nil {
			r.t.err("resolve", err)
			return
		}
		tlsConf.NextProtos = []string{http3.NextProtoH3}
		qc := &quic.Config{MaxIdleTimeout: 60 * time.Second, HandshakeIdleTimeout: 10 * time.Second}
		if r.interval == 0 {
			qc.KeepAlivePeriod = r.keepalive
		}
		conn, err := tr.Dial(ctx, addr, tlsConf, qc)
		if err != nil {
			r.t.err("handshake", err)
			r.ended()
			return
		}
		r.connsMu.Lock()
		r.conns = append(r.conns, conn)
		r.connsMu.Unlock()
		established()
		rt = (&http3.Transport{}).NewClientConn(conn)
		closeConn = func() { _ = conn.CloseWithError(0, "") }
	default:
		d := &net.Dialer{Timeout: 10 * time.Second}
		if local != nil {
			d.LocalAddr = &net.TCPAddr{IP: local}
		}
		h := &http.Transport{
			TLSClientConfig:   tlsConf,
			DialContext:       d.DialContext,
			MaxConnsPerHost:   1,
			ForceAttemptHTTP2: r.proto == "h2",
			IdleConnTimeout:   90 * time.Second,
		}
		if r.proto == "http1.1" {
			h.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		rt = h
		closeConn = h.CloseIdleConnections
		// The TCP handshake and TLS happen with the first request: counted there.
		established()
	}
	defer closeConn()
	url := "https://" + r.server + r.path
	asked, served := 0, 0
	defer func() {
		if asked > 0 && served == 0 {
			r.t.Lock()
			r.t.r.NeverServed++
			r.t.Unlock()
		}
	}()
	next := due
	if r.interval == 0 {
		// Idle: quic-go's keep-alive PINGs until the run ends.
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(r.windowEnd)):
		}
		return
	}
	for {
		time.Sleep(time.Until(next))
		sent := time.Now()
		if !sent.Before(r.windowEnd) {
			return
		}
		counts := r.inWindow(sent)
		if counts {
			asked++
			r.t.Lock()
			r.t.r.Requests++
			r.t.Unlock()
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("User-Agent", "udpx-quicgo-load")
		ok, n, err := fetch(rt, req, r.size)
		now := time.Now()
		r.t.Lock()
		if r.inWindow(now) {
			r.t.r.Bytes += uint64(n)
		}
		if counts {
			switch {
			case ok:
				r.t.r.Served++
				served++
				lat := now.Sub(sent)
				r.t.latencies = append(r.t.latencies, lat.Microseconds())
				if lat > r.interval {
					r.t.r.Late++
				}
			case ctx.Err() != nil:
				// Still unanswered when the run ended: counted as such, not as failed.
			default:
				r.t.r.Failed++
			}
		}
		r.t.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				r.t.err("request", err)
			}
			if ctx.Err() != nil || r.proto == "h3" {
				// A broken HTTP/3 connection is not reopened: the player is gone, as a
				// player whose connection died would be.
				if now.Before(r.windowEnd) {
					r.ended()
				}
				return
			}
		}
		next = sent.Add(r.interval)
	}
}

func (r *run) ended() {
	r.t.Lock()
	r.t.r.EndedEarly++
	r.t.Unlock()
}

// One request: whether it came back whole with 200, its body bytes.
func fetch(rt http.RoundTripper, req *http.Request, size int64) (bool, int64, error) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return false, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return false, n, err
	}
	whole := (size < 0 || n == size) && (resp.ContentLength < 0 || n == resp.ContentLength)
	return resp.StatusCode == http.StatusOK && whole, n, nil
}
