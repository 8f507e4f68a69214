package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/holdfast/holdfast/internal/state"
)

// HTTPCatalog is a CatalogWriter that writes through a server's HTTP API
// (PUT /v1/catalog/register and /v1/catalog/deregister), for an agent that
// has no raft of its own: a client agent runs its node's checks with it.
//
// Its methods may be called concurrently. A 4xx answer (the request itself
// was wrong) wraps state.ErrInvalidRequest with the server's sentence; any
// other failure is an error the runner retries.
type HTTPCatalog struct {
	// Base returns the base URL of a server's HTTP API, e.g.
	// "http://127.0.0.1:8500", for each write, so the caller may pick a
	// live server every time.
	Base func() (string, error)
	// Client makes the requests; nil means http.DefaultClient. Each write
	// is bounded by the context it is given.
	Client *http.Client
}

// Register implements CatalogWriter.
func (c *HTTPCatalog) Register(ctx context.Context, req *state.RegisterRequest) error {
	return c.put(ctx, "/v1/catalog/register", req)
}

// Deregister implements CatalogWriter.
func (c *HTTPCatalog) Deregister(ctx context.Context, req *state.DeregisterRequest) error {
	return c.put(ctx, "/v1/catalog/deregister", req)
}

func (c *HTTPCatalog) put(ctx context.Context, path string, body interface{}) error {
	base, err := c.Base()
	if err != nil {
		return fmt.Errorf("agent: no server to write the catalog through: %w", err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("agent: encoding a catalog write: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, strings.TrimSuffix(base, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("agent: catalog write: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("agent: catalog write to %s: %w", base, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode/100 == 4:
		return fmt.Errorf("%w: %s", state.ErrInvalidRequest, bytes.TrimSpace(msg))
	default:
		return fmt.Errorf("agent: catalog write to %s: %s: %s", base, resp.Status, bytes.TrimSpace(msg))
	}
}
