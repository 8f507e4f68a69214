package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/holdfast/holdfast/api"
	"github.com/holdfast/holdfast/internal/servertest"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func serverClient(t *testing.T) *api.Client {
	t.Helper()
	srv := servertest.New(t, servertest.Options{})
	c, err := api.NewClient(&api.Config{Address: srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hold creates a session without lock-delay, locks key with it and returns
// the hold's sequencer.
func hold(t *testing.T, ctx context.Context, c *api.Client, key string) api.Sequencer {
	t.Helper()
	sid, _, err := c.Session().Create(ctx, &api.SessionEntry{LockDelay: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return acquireAs(t, ctx, c, key, sid)
}

func acquireAs(t *testing.T, ctx context.Context, c *api.Client, key, sid string) api.Sequencer {
	t.Helper()
	ok, _, err := c.KV().Acquire(ctx, &api.KVPair{Key: key, Session: sid}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire %s by %s: %v %v", key, sid, ok, err)
	}
	p, _, err := c.KV().Get(ctx, key, nil)
	if err != nil || p == nil || p.Session != sid {
		t.Fatalf("after acquire: %+v %v", p, err)
	}
	return api.Sequencer{Key: key, Session: sid, LockIndex: p.LockIndex}
}

func TestStaleHolderFencedWriteRefused(t *testing.T) {
	ctx := testCtx(t)
	c := serverClient(t)
	kv := c.KV()

	old := hold(t, ctx, c, "res/lock")
	if old.LockIndex != 1 {
		t.Fatalf("first hold: %v", old)
	}
	st, _, err := kv.Fence(ctx, old, nil)
	if err != nil || !st.Valid || st.Session != old.Session || st.LockIndex != 1 {
		t.Fatalf("fence of the current hold: %+v %v", st, err)
	}
	if ok, _, err := kv.PutFenced(ctx, &api.KVPair{Key: "res/data", Value: []byte("from old")}, old, nil); err != nil || !ok {
		t.Fatalf("fenced write by the current holder: %v %v", ok, err)
	}

	// The old holder's session dies (it was paused past its TTL, say) and
	// someone else takes the lock.
	if _, err := c.Session().Destroy(ctx, old.Session, nil); err != nil {
		t.Fatal(err)
	}
	cur := hold(t, ctx, c, "res/lock")
	if cur.LockIndex != 2 {
		t.Fatalf("second hold: %v", cur)
	}

	// The old holder wakes up and writes as if nothing happened.
	st, _, err = kv.Fence(ctx, old, nil)
	if err != nil || st.Valid || st.Session != cur.Session || st.LockIndex != 2 {
		t.Fatalf("fence of the stale hold: %+v %v", st, err)
	}
	if ok, _, err := kv.PutFenced(ctx, &api.KVPair{Key: "res/data", Value: []byte("stale")}, old, nil); err != nil || ok {
		t.Fatalf("stale fenced write: ok=%v err=%v, want refused", ok, err)
	}
	if ok, _, err := kv.DeleteFenced(ctx, "res/data", old, nil); err != nil || ok {
		t.Fatalf("stale fenced delete: ok=%v err=%v, want refused", ok, err)
	}
	p, _, err := kv.Get(ctx, "res/data", nil)
	if err != nil || p == nil || string(p.Value) != "from old" {
		t.Fatalf("data after refused writes: %+v %v", p, err)
	}

	// The refusal says why.
	ok, resp, _, err := c.Txn().Txn(ctx, api.TxnOps{
		api.CheckLockOp(old),
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "res/data", Value: []byte("stale")}},
	}, nil)
	if err != nil || ok || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 0 ||
		!strings.Contains(resp.Errors[0].What, "failed lock check") {
		t.Fatalf("txn: ok=%v resp=%+v err=%v", ok, resp, err)
	}

	if ok, _, err := kv.PutFenced(ctx, &api.KVPair{Key: "res/data", Value: []byte("from cur")}, cur, nil); err != nil || !ok {
		t.Fatalf("fenced write by the new holder: %v %v", ok, err)
	}
	if ok, _, err := kv.DeleteFenced(ctx, "res/data", cur, nil); err != nil || !ok {
		t.Fatalf("fenced delete by the new holder: %v %v", ok, err)
	}
}

func TestReleaseFencedIgnoresALaterHold(t *testing.T) {
	ctx := testCtx(t)
	c := serverClient(t)
	kv := c.KV()
	first := hold(t, ctx, c, "svc/leader")
	pair := &api.KVPair{Key: "svc/leader", Session: first.Session}

	if ok, _, err := kv.ReleaseFenced(ctx, pair, first.LockIndex+1, nil); err != nil || ok {
		t.Fatalf("release naming a hold that never was: %v %v", ok, err)
	}
	if ok, _, err := kv.ReleaseFenced(ctx, pair, first.LockIndex, nil); err != nil || !ok {
		t.Fatalf("release of the current hold: %v %v", ok, err)
	}
	// The same session locks again; the first release, delayed in the
	// network, arrives now and must not free the new hold.
	second := acquireAs(t, ctx, c, "svc/leader", first.Session)
	if second.LockIndex != first.LockIndex+1 {
		t.Fatalf("second hold %v after %v", second, first)
	}
	if ok, _, err := kv.ReleaseFenced(ctx, pair, first.LockIndex, nil); err != nil || ok {
		t.Fatalf("delayed release: %v %v, want refused", ok, err)
	}
	st, _, err := kv.Fence(ctx, second, nil)
	if err != nil || !st.Valid {
		t.Fatalf("second hold after the delayed release: %+v %v", st, err)
	}
	if _, _, err := kv.ReleaseFenced(ctx, pair, 0, nil); err == nil {
		t.Fatal("release with LockIndex 0 was sent")
	}
}

func TestFenceRejectsIncompleteSequencers(t *testing.T) {
	c, err := api.NewClient(&api.Config{Address: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	for _, seq := range []api.Sequencer{
		{Session: "s", LockIndex: 1},
		{Key: "k", LockIndex: 1},
		{Key: "k", Session: "s"},
	} {
		if _, _, err := c.KV().Fence(ctx, seq, nil); err == nil {
			t.Errorf("Fence(%v) sent", seq)
		}
		if _, _, err := c.KV().PutFenced(ctx, &api.KVPair{Key: "x"}, seq, nil); err == nil {
			t.Errorf("PutFenced(%v) sent", seq)
		}
	}
}

// TestTxnWire pins what Txn sends and how it reads a rollback: LockIndex
// travels only when set, so plain transactions stay Consul's.
func TestTxnWire(t *testing.T) {
	var body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		body = string(b)
		if r.Method != http.MethodPut || r.URL.Path != "/v1/txn" {
			http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"Results":null,"Errors":[{"OpIndex":0,"What":"failed lock check"}]}`)
	}))
	defer srv.Close()
	c, err := api.NewClient(&api.Config{Address: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ok, resp, _, err := c.Txn().Txn(testCtx(t), api.TxnOps{
		api.CheckLockOp(api.Sequencer{Key: "k", Session: "s", LockIndex: 7}),
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: "d", Value: []byte("v")}},
	}, nil)
	if err != nil || ok || resp == nil || len(resp.Errors) != 1 || resp.Errors[0].What != "failed lock check" {
		t.Fatalf("ok=%v resp=%+v err=%v", ok, resp, err)
	}
	var sent []map[string]map[string]any
	if err := json.Unmarshal([]byte(body), &sent); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	if got := sent[0]["KV"]["LockIndex"]; got != float64(7) {
		t.Errorf("check-lock LockIndex = %v in %s", got, body)
	}
	if _, has := sent[1]["KV"]["LockIndex"]; has {
		t.Errorf("set carries a LockIndex: %s", body)
	}
	if sent[1]["KV"]["Value"] != "dg==" || sent[0]["KV"]["Verb"] != "check-lock" {
		t.Errorf("body %s", body)
	}
}
