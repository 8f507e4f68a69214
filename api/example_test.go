package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"

	"github.com/holdfast/holdfast/api"
)

// toyAgent is a few dozen lines standing in for a holdfast agent in the
// examples: KV get/put with ?acquire, and session create. It keeps no
// lock-delay, checks or TTLs.
func toyAgent() *httptest.Server {
	var (
		mu    sync.Mutex
		index uint64 = 1
		kv           = map[string]*api.KVPair{}
	)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.URL.Path == "/v1/session/create":
			index++
			json.NewEncoder(w).Encode(map[string]string{"ID": "adf4238a-882b-9ddc-4a9d-5b6758e4159e"})
		case strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.Method == http.MethodGet:
			p, ok := kv[strings.TrimPrefix(r.URL.Path, "/v1/kv/")]
			w.Header().Set("X-Consul-KnownLeader", "true")
			w.Header().Set("X-Consul-LastContact", "0")
			if !ok {
				w.Header().Set("X-Consul-Index", strconv.FormatUint(index, 10))
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.Header().Set("X-Consul-Index", strconv.FormatUint(p.ModifyIndex, 10))
			json.NewEncoder(w).Encode([]*api.KVPair{p})
		case strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.Method == http.MethodPut:
			key := strings.TrimPrefix(r.URL.Path, "/v1/kv/")
			body, _ := io.ReadAll(r.Body)
			flags, _ := strconv.ParseUint(r.URL.Query().Get("flags"), 10, 64)
			p := kv[key]
			if p == nil {
				p = &api.KVPair{Key: key}
			}
			if r.URL.Query().Has("acquire") {
				s := r.URL.Query().Get("acquire")
				if p.Session != "" && p.Session != s {
					io.WriteString(w, "false")
					return
				}
				if p.Session == "" {
					p.LockIndex++
				}
				p.Session = s
			}
			index++
			if p.CreateIndex == 0 {
				p.CreateIndex = index
			}
			p.ModifyIndex, p.Value, p.Flags = index, body, flags
			kv[key] = p
			io.WriteString(w, "true")
		default:
			http.Error(w, "not in this toy", http.StatusNotImplemented)
		}
	}))
}

func ExampleKV_Put() {
	agent := toyAgent()
	defer agent.Close()

	client, err := api.NewClient(&api.Config{Address: agent.URL})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	kv := client.KV()

	if _, err := kv.Put(ctx, &api.KVPair{Key: "redis/config/minconns", Value: []byte("1")}, nil); err != nil {
		log.Fatal(err)
	}
	pair, meta, err := kv.Get(ctx, "redis/config/minconns", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s = %s (index %d)\n", pair.Key, pair.Value, meta.LastIndex)

	// A missing key is a nil pair, not an error.
	missing, _, err := kv.Get(ctx, "redis/config/maxconns", nil)
	fmt.Println(missing == nil, err)
	// Output:
	// redis/config/minconns = 1 (index 2)
	// true <nil>
}

func ExampleSession_Create() {
	agent := toyAgent()
	defer agent.Close()

	client, err := api.NewClient(&api.Config{Address: agent.URL})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	// A session with a TTL the holder must renew, that deletes its keys when
	// it is invalidated, and no lock-delay (negative LockDelay sends 0).
	id, _, err := client.Session().Create(ctx, &api.SessionEntry{
		Name:      "my-service-lock",
		TTL:       "30s",
		Behavior:  api.SessionBehaviorDelete,
		LockDelay: -1,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("session", id)

	ok, meta, err := client.KV().Acquire(ctx, &api.KVPair{Key: "service/leader", Value: []byte("node-1"), Session: id}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if !ok {
		// holdfast says when a refusal is due to lock-delay, and for how long.
		fmt.Println("not acquired; lock-delay remaining:", meta.LockDelayRemaining)
		return
	}
	pair, _, err := client.KV().Get(ctx, "service/leader", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s held by %s, sequencer %d\n", pair.Key, pair.Session, pair.LockIndex)
	// Output:
	// session adf4238a-882b-9ddc-4a9d-5b6758e4159e
	// service/leader held by adf4238a-882b-9ddc-4a9d-5b6758e4159e, sequencer 1
}
