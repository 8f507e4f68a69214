package httpapi

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// validateKeyRef is validateKey's ".." rule as first written, with
// strings.FieldsFunc: the allocation-free scan must agree with it.
func validateKeyRef(key string) bool {
	for _, seg := range strings.FieldsFunc(key, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == ".." {
			return false
		}
	}
	return true
}

// dotDotRefused reports whether validateKey refused key for a ".."
// segment: by the rule's own words, which end the message, since the key
// quoted before them may hold `".."` itself (` "..` did, and a white-space
// refusal passed for this one).
func dotDotRefused(key string) bool {
	return strings.HasSuffix(errString(validateKey(key)), `: ".." path segments are not allowed`)
}

func TestValidateKeyDotDot(t *testing.T) {
	for _, k := range []string{"", "a", "..", "../a", "a/..", "a/../b", "a\\..\\b", "...", "a/.../b",
		"..a", "a..", "//..//", "\\..", "./.", "a/./b", "x/\xff../..", "é/..", "..é", "a//b", "/", "\\",
		" \"..", "\t\"..\"", "a/\"..\" ", " ../a "} {
		got := !dotDotRefused(k)
		if want := validateKeyRef(k); got != want {
			t.Errorf("validateKey(%q): accepted=%v, want %v", k, got, want)
		}
	}
}

func FuzzValidateKeyDotDot(f *testing.F) {
	f.Add("a/../b")
	f.Fuzz(func(t *testing.T, k string) {
		got := !dotDotRefused(k)
		if want := validateKeyRef(k); got != want {
			t.Fatalf("validateKey(%q): accepted=%v, want %v", k, got, want)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The handler assigns header keys directly, without Header.Set's
// canonicalisation: they must already be canonical.
func TestHeaderKeysCanonical(t *testing.T) {
	for _, k := range []string{"Allow", "Content-Type", "X-Content-Type-Options", "Content-Security-Policy",
		"X-Consul-Index", "X-Consul-Knownleader", "X-Consul-Lastcontact", "X-Consul-Effective-Consistency"} {
		if c := http.CanonicalHeaderKey(k); c != k {
			t.Errorf("%q is not canonical (%q)", k, c)
		}
	}
}

// wantPretty and checkDatacenter skip parsing a query that cannot hold
// their parameter; they must agree with parsing it.
func TestQueryFastPaths(t *testing.T) {
	for _, raw := range []string{"", "index=5&wait=1s", "pretty", "pretty=1", "x=pretty", "%70retty", "a=1&%70retty=",
		"dc=dc1", "dc=dc2", "%64c=dc2", "x=dc2", "dcx=1", "pretty&dc=DC1", "%zz", "a=%"} {
		r := &http.Request{URL: &url.URL{Path: "/v1/kv/k", RawQuery: raw}}
		q, _ := url.ParseQuery(raw)
		if _, want := q["pretty"]; wantPretty(r) != want {
			t.Errorf("wantPretty(%q) = %v, want %v", raw, !want, want)
		}
		h := &handler{b: newFakeBackend(newFakeClock())}
		dc := q.Get("dc")
		want := dc == "" || strings.EqualFold(dc, testDC)
		if got := h.checkDatacenter(r) == nil; got != want {
			t.Errorf("checkDatacenter(%q) ok = %v, want %v", raw, got, want)
		}
	}
}
