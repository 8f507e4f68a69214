package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/internal/servertest"
)

// TestSeedTranscript replays the `consul kv` session of the seed
// ../shared/seeds/003_* with holdfast in place of consul, through Run
// against an in-process server whose clock is fake, and checks that every
// command prints what consul printed there, byte for byte, with two
// exceptions:
//
//   - indexes: the seed's server had thousands of writes behind it, ours
//     starts empty. The CreateIndex and ModifyIndex lines are compared
//     without their numbers; instead the test checks that they move as the
//     seed's do (CreateIndex fixed while the key lives, ModifyIndex rising
//     with every change).
//   - LockIndex: holdfast never moves it backwards (docs/compatibility.md,
//     section 1), where Consul resets it to 0 on a plain PUT. Each step
//     whose LockIndex differs says what the seed showed and why.
//
// The seed's session IDs are kept in the expected text; the IDs our server
// hands out are mapped onto them before comparing. The seed created its
// sessions with curl; here `holdfast session create` does it with the same
// settings. Where the seed waited for a TTL in real time, the test moves
// the fake clock and waits (with blocking queries) for the invalidation.
func TestSeedTranscript(t *testing.T) {
	srv := servertest.New(t, servertest.Options{NodeName: "VM-0-17-centos"})
	sr := &seedReplay{t: t, srv: srv, ids: map[string]string{}}

	const key = "redis/config/minconns"
	const (
		s1 = "e6c8e941-4c80-1ead-cedc-80d66fb99e64" // release, TTL 30s: expires
		s2 = "4ee167e5-32f4-0b21-2f25-d02b861dc06c" // the second holder
		s3 = "79c92b78-0c0a-b273-2c34-24d538c2c558" // never holds the lock
		s4 = "8ccec390-a259-e527-9754-c99810f9cea1" // delete behaviour
	)
	createRelease := []string{"session", "create", "-name", "my-service-lock", "-behavior", "release", "-ttl", "30s", "-lock-delay", "15s"}

	// 2. HTTP: the seed's curl -X PUT /v1/session/create with
	// {"LockDelay":"15s","Name":"my-service-lock","Behavior":"release","TTL":"30s"}.
	sr.create(s1, createRelease...)

	// 3. KV integration.
	sr.ok("Success! Lock acquired on: "+key+"\n", "kv", "put", "-acquire", "-session="+s1, key, "1")
	sr.ok(detailed(key, "1", s1, "1"), "kv", "get", "-detailed", key)

	// "等到session到期后，再次查看KV": wait for the session to expire,
	// look again. The lock is released; value and LockIndex stay.
	sr.expire(s1, 30*time.Second)
	sr.ok(detailed(key, "1", "-", "1"), "kv", "get", "-detailed", key)

	// "创建2个session，再次测试": two more sessions. The seed's user took
	// longer than the 15s lock-delay that the expiry started; move the
	// clock past it, or the acquire below would be refused for the delay.
	srv.Clock.Advance(15 * time.Second)
	sr.create(s2, createRelease...)
	sr.create(s3, createRelease...)

	sr.ok("Success! Lock acquired on: "+key+"\n", "kv", "put", "-acquire", "-session="+s2, key, "1")
	sr.ok("Success! Lock acquired on: "+key+"\n", "kv", "put", "-acquire", "-session="+s2, key, "3")
	sr.ok("Success! Lock acquired on: "+key+"\n", "kv", "put", "-acquire", "-session="+s2, key, "4")
	sr.fails("Error! Did not acquire lock\n", "kv", "put", "-acquire", "-session="+s3, key, "2")
	// Seed: LockIndex 1. Counting the acquisitions shown, it is 2 in
	// Consul too (s1's, then s2's; re-acquiring by the holder does not
	// count): the seed's user wrote to the key between the two parts of
	// the page (ModifyIndex jumps from 3940 to 4013), and a plain PUT
	// resets Consul's LockIndex to 0. holdfast counts every acquisition.
	sr.ok(detailed(key, "2", s2, "4"), "kv", "get", "-detailed", key)

	sr.fails("Error! Did not release lock\n", "kv", "put", "-release", "-session="+s3, key, "1")
	sr.ok("Success! Data written to: "+key+"\n", "kv", "put", key, "10")
	sr.fails("Error! Did not release lock\n", "kv", "put", "-release", "-session="+s3, key, "1")
	// Seed: LockIndex 0. Consul resets it on the plain PUT above (the key
	// stays locked by s2); holdfast keeps it, so the sequencer
	// (key, LockIndex, Session) is never reused.
	sr.ok(detailed(key, "2", s2, "10"), "kv", "get", "-detailed", key)

	sr.fails("Error! Missing -session (required with -acquire and -release)\n", "kv", "put", "-release", key, "10")
	// Release by the holder with no data: the value is replaced by an
	// empty one (release writes the body, as in Consul).
	sr.ok("Success! Lock released on: "+key+"\n", "kv", "put", "-release", "-session="+s2, key)
	// Seed: LockIndex 0, for the reason above.
	sr.ok(detailed(key, "2", "-", ""), "kv", "get", "-detailed", key)
	// The seed shows no output for an empty value: it is an empty line.
	sr.ok("\n", "kv", "get", key)

	// "创建一个删除行为的session": a session with behaviour delete,
	// {"LockDelay":"5s","Name":"my-service-lock","Behavior":"delete","TTL":"30s"}.
	sr.create(s4, "session", "create", "-name", "my-service-lock", "-behavior", "delete", "-ttl", "30s", "-lock-delay", "5s")
	sr.ok("Success! Lock acquired on: "+key+"\n", "kv", "put", "-acquire", "-session="+s4, key, "1")
	// Seed: LockIndex 2 (its 0 after the plain PUT, then this
	// acquisition and, it seems, one more not shown). holdfast: one more
	// than the 2 it kept.
	sr.ok(detailed(key, "3", s4, "1"), "kv", "get", "-detailed", key)

	// "等到session过期后KV被自动删除了": once the session expires, the key
	// is gone.
	sr.expire(s4, 30*time.Second)
	sr.fails("Error! No key exists at: "+key+"\n", "kv", "get", "-detailed", key)

	// The indexes: the seed showed CreateIndex 3874 throughout and
	// ModifyIndex 3937, 3940, 4013, 4017, 4021, 4042: one creation, and a
	// strictly rising ModifyIndex between reads that follow a change.
	if len(sr.indexes) != 6 {
		t.Fatalf("read %d detailed entries, want 6", len(sr.indexes))
	}
	for i, ix := range sr.indexes {
		if ix[0] != sr.indexes[0][0] {
			t.Errorf("read %d: CreateIndex %d, want %d as before (the key was never deleted)", i, ix[0], sr.indexes[0][0])
		}
		if ix[1] < ix[0] {
			t.Errorf("read %d: ModifyIndex %d below CreateIndex %d", i, ix[1], ix[0])
		}
		if i > 0 && ix[1] <= sr.indexes[i-1][1] {
			t.Errorf("read %d: ModifyIndex %d, want above the previous read's %d", i, ix[1], sr.indexes[i-1][1])
		}
	}
}

// detailed is `kv get -detailed` as the seed prints it, with the index
// numbers left out (see seedReplay.ok).
func detailed(key, lockIndex, session, value string) string {
	return "CreateIndex      #\n" +
		"Flags            0\n" +
		"Key              " + key + "\n" +
		"LockIndex        " + lockIndex + "\n" +
		"ModifyIndex      #\n" +
		"Session          " + session + "\n" +
		"Value            " + value + "\n"
}

// seedReplay runs CLI commands against srv and compares their output.
type seedReplay struct {
	t   *testing.T
	srv *servertest.Server
	// ids maps the session IDs our server gave to the seed's.
	ids map[string]string
	// indexes are the (CreateIndex, ModifyIndex) of each detailed read.
	indexes [][2]uint64
}

func (sr *seedReplay) run(args ...string) (stdout, stderr string, code int) {
	sr.t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	getenv := func(k string) string {
		if k == "HOLDFAST_HTTP_ADDR" {
			return sr.srv.Addr
		}
		return ""
	}
	// The seed's IDs stand for ours in the arguments.
	args = append([]string(nil), args...)
	for i := range args {
		for ours, seed := range sr.ids {
			args[i] = strings.ReplaceAll(args[i], seed, ours)
		}
	}
	err := Run(ctx, args, Stdio{In: strings.NewReader(""), Out: &out, Err: &errb, Getenv: getenv})
	return sr.toSeed(out.String()), sr.toSeed(errb.String()), ExitCode(err)
}

// toSeed writes our session IDs as the seed's.
func (sr *seedReplay) toSeed(s string) string {
	for ours, seed := range sr.ids {
		s = strings.ReplaceAll(s, ours, seed)
	}
	return s
}

var indexLine = regexp.MustCompile(`(?m)^(CreateIndex|ModifyIndex)( +)([0-9]+)$`)

// normalise drops trailing blanks from each line (tabwriter pads an empty
// Value; the seed's page does not show the padding) and takes the index
// numbers out of detailed output, recording them.
func (sr *seedReplay) normalise(s string, record bool) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	s = strings.Join(lines, "\n")
	var ix [2]uint64
	n := 0
	s = indexLine.ReplaceAllStringFunc(s, func(m string) string {
		parts := indexLine.FindStringSubmatch(m)
		v, _ := strconv.ParseUint(parts[3], 10, 64)
		if parts[1] == "CreateIndex" {
			ix[0] = v
		} else {
			ix[1] = v
		}
		n++
		return parts[1] + parts[2] + "#"
	})
	if record && n == 2 {
		sr.indexes = append(sr.indexes, ix)
	}
	return s
}

// ok runs a command that must succeed and print want on stdout.
func (sr *seedReplay) ok(want string, args ...string) {
	sr.t.Helper()
	out, errs, code := sr.run(args...)
	got := sr.normalise(out, true)
	if code != 0 || errs != "" || got != sr.normalise(want, false) {
		sr.t.Fatalf("holdfast %s\nexit %d, stderr %q\nstdout:\n%s\nwant:\n%s", strings.Join(args, " "), code, errs, out, want)
	}
}

// fails runs a command that must exit 1 having printed want on stderr
// and nothing on stdout.
func (sr *seedReplay) fails(want string, args ...string) {
	sr.t.Helper()
	out, errs, code := sr.run(args...)
	if code != 1 || out != "" || errs != want {
		sr.t.Fatalf("holdfast %s\nexit %d, stdout %q\nstderr %q\nwant stderr %q and exit 1", strings.Join(args, " "), code, out, errs, want)
	}
}

var uuidLine = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\n$`)

// create runs a session create, which prints the new ID alone on a line,
// and lets seedID stand for it from then on.
func (sr *seedReplay) create(seedID string, args ...string) {
	sr.t.Helper()
	out, errs, code := sr.run(args...)
	if code != 0 || errs != "" || !uuidLine.MatchString(out) {
		sr.t.Fatalf("holdfast %s\nexit %d, stderr %q, stdout %q: want one session ID", strings.Join(args, " "), code, errs, out)
	}
	sr.ids[strings.TrimSpace(out)] = seedID
}

// expire moves the fake clock by ttl and waits until the session that
// seedID stands for has been invalidated: the expiry is proposed to raft
// by the leader's timer goroutine, so it lands a little after the clock
// moves. The wait is a chain of blocking queries, bounded in count and in
// real time; nothing sleeps.
func (sr *seedReplay) expire(seedID string, ttl time.Duration) {
	sr.t.Helper()
	var id string
	for ours, seed := range sr.ids {
		if seed == seedID {
			id = ours
		}
	}
	sr.srv.Clock.Advance(ttl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	index := "0"
	for attempt := 0; attempt < 100; attempt++ {
		url := fmt.Sprintf("%s/v1/session/info/%s?index=%s", sr.srv.URL, id, index)
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			sr.t.Fatalf("waiting for session %s to expire: %v", seedID, err)
		}
		var list []json.RawMessage
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			sr.t.Fatalf("waiting for session %s to expire: status %d, %v", seedID, resp.StatusCode, err)
		}
		if len(list) == 0 {
			return
		}
		index = resp.Header.Get("X-Consul-Index")
	}
	sr.t.Fatalf("session %s still exists after 100 blocking queries", seedID)
}

// Spec section 3 (and section 8.7, "replicate"): the TTL range error
// prints the TTL as an integer number of nanoseconds, "Invalid Session
// TTL '5000000000', must be between [10s=24h0m0s]", through the real
// server as through the stubs (the server used to print the TTL as given,
// '5s').
func TestSessionCreateTTLRangeMessage(t *testing.T) {
	sr := &seedReplay{t: t, srv: servertest.New(t, servertest.Options{}), ids: map[string]string{}}
	for _, c := range []struct{ ttl, ns string }{
		{"5s", "5000000000"},
		{"9999ms", "9999000000"},
		{"25h", "90000000000000"},
	} {
		out, errs, code := sr.run("session", "create", "-ttl", c.ttl)
		want := "Error! Failed to create session: Unexpected response code: 400 (Invalid Session TTL '" + c.ns +
			"', must be between [10s=24h0m0s])\n"
		if code != 1 || out != "" || errs != want {
			t.Errorf("-ttl %s: exit %d, stdout %q\nstderr %q\nwant   %q", c.ttl, code, out, errs, want)
		}
	}
}
