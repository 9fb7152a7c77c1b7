// A podlock client in Go (standard library only): acquire, write with the fencing token,
// release. PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); STORE_URL: a fenced
// resource (default http://127.0.0.1:8000).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

type grant struct {
	FencingToken int64  `json:"fencingToken"`
	HolderID     string `json:"holderId"`
}

type apiError struct {
	Code    string `json:"error"`
	Message string `json:"message"`
}

func (e apiError) Error() string { return e.Code + ": " + e.Message }

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// post sends body to the sidecar and decodes the answer into out, or returns its error.
func post(path string, body, out any) error {
	data, _ := json.Marshal(body)
	resp, err := http.Post(env("PODLOCK_ADDR", "http://127.0.0.1:4040")+path, "application/json", bytes.NewReader(data))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e apiError
		json.NewDecoder(resp.Body).Decode(&e)
		return e
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func main() {
	holder := map[string]any{"holderId": "go-example"}
	var g grant
	acquire := map[string]any{"holderId": "go-example", "waitSeconds": 30}
	if c := os.Getenv("PODLOCK_CONTAINER"); c != "" {
		// Set by the injector: the hold then ends when this container restarts, and not when
		// another container of the pod does.
		acquire["container"] = c
	}
	if err := post("/v1/locks/report/acquire", acquire, &g); err != nil {
		fmt.Fprintln(os.Stderr, "acquire:", err)
		os.Exit(1)
	}
	fmt.Printf("acquired report with fencing token %d\n", g.FencingToken)
	url := fmt.Sprintf("%s/increment?token=%d&writer=go-example", env("STORE_URL", "http://127.0.0.1:8000"), g.FencingToken)
	resp, err := http.Post(url, "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "fenced write refused:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote with token %d\n", g.FencingToken)
	var released map[string]bool
	if err := post("/v1/locks/report/release", holder, &released); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	fmt.Println("released")
}
