// A podlock client in Go (standard library only) that holds a lock while its work lasts and
// stops the work when it loses the lock.
//
// The hold is bound to its HTTP connection (POST /v1/locks/{name}/hold): no heartbeat to send,
// and closing the connection, or the process dying, releases it at once. The stream tells the
// hold's end: a `lost` event (lease expired or revoked, key or lock deleted, the sidecar
// stopping), or the stream ending or going silent (the sidecar died, hangs or is unreachable).
//
// PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); LOCK: the lock (report);
// STORE_URL: a fenced resource such as examples/fenced_store.py (http://127.0.0.1:8000);
// WORK_ITEMS: writes to make (10). Exit status: 0 done and released, 1 not acquired, 75 the
// lock was lost.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// keepAlive is how often the sidecar sends a keep-alive line; three missed mean it hangs.
const keepAlive = time.Second

// waitSeconds is how long the hold may wait in the queue: the sidecar answers once it is
// granted, so the answer may take that long, and answerWithin more (no answer by then means
// the sidecar hangs). A shorter limit would give up, and lose the place in the queue, while
// still waiting.
const (
	waitSeconds  = 30
	answerWithin = 2 * time.Second
)

// client waits for the hold's answer as long as the hold may wait, and no longer; the stream
// that follows has its own limit (keepAlive).
var client = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = waitSeconds*time.Second + answerWithin
	return &http.Client{Transport: t}
}()

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// hold takes the lock: its fencing token, a channel that says why the hold ended, and the
// connection, whose Close releases the hold.
func hold(addr, lock string) (int64, <-chan string, io.Closer, error) {
	options := map[string]any{"waitSeconds": waitSeconds, "keepAliveSeconds": keepAlive.Seconds()}
	if c := os.Getenv("PODLOCK_CONTAINER"); c != "" {
		// Set by the injector: the hold then ends when this container restarts, and not when
		// another container of the pod does.
		options["container"] = c
	}
	body, _ := json.Marshal(options)
	resp, err := client.Post(addr+"/v1/locks/"+lock+"/hold", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e struct{ Error, Message string }
		json.NewDecoder(resp.Body).Decode(&e)
		return 0, nil, nil, fmt.Errorf("%s: %s", e.Error, e.Message)
	}
	silent := time.AfterFunc(3*keepAlive, func() { resp.Body.Close() })
	events := bufio.NewReader(resp.Body)
	event, data, err := next(events, silent)
	var grant struct{ FencingToken int64 }
	if err != nil || event != "acquired" || json.Unmarshal([]byte(data), &grant) != nil {
		resp.Body.Close()
		return 0, nil, nil, fmt.Errorf("the hold's stream began without a grant (%v)", err)
	}
	ended := make(chan string, 1)
	go func() {
		event, data, err := next(events, silent)
		if err != nil {
			ended <- "the hold's stream ended (the sidecar stopped, hangs or is unreachable): " + err.Error()
			return
		}
		var ev struct{ Reason string }
		json.Unmarshal([]byte(data), &ev)
		ended <- event + ": " + ev.Reason // `lost`, or `released` by a request of the same holder
	}()
	return grant.FencingToken, ended, resp.Body, nil
}

// next reads the next server-sent event's name and data, skipping keep-alive lines; each line
// read puts off the silence timer.
func next(r *bufio.Reader, silent *time.Timer) (event, data string, err error) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		silent.Reset(3 * keepAlive)
		line = strings.TrimRight(line, "\r\n")
		field, value, _ := strings.Cut(line, ":")
		switch {
		case field == "event":
			event = strings.TrimSpace(value)
		case field == "data":
			data = strings.TrimSpace(value)
		case line == "" && event != "":
			return event, data, nil
		}
	}
}

// write is one piece of work; false when the store refused the token (a newer holder wrote).
func write(store string, token int64) (bool, error) {
	resp, err := http.Post(fmt.Sprintf("%s/increment?token=%d&writer=go-example", store, token), "", nil)
	if err != nil {
		return false, err
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusConflict, nil
}

func main() {
	lock, store := env("LOCK", "report"), env("STORE_URL", "http://127.0.0.1:8000")
	items, _ := strconv.Atoi(env("WORK_ITEMS", "10"))
	token, ended, conn, err := hold(env("PODLOCK_ADDR", "http://127.0.0.1:4040"), lock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "could not acquire %s: %v\n", lock, err)
		os.Exit(1)
	}
	fmt.Printf("acquired %s with fencing token %d\n", lock, token)
	lost := func(why string, done int) {
		fmt.Fprintf(os.Stderr, "lost %s: %s; stopped after %d writes\n", lock, why, done)
		os.Exit(75)
	}
	for done := 0; done < items; done++ {
		select {
		case why := <-ended:
			lost(why, done)
		default: // still held: do the next piece of work
		}
		if ok, err := write(store, token); err != nil {
			fmt.Fprintln(os.Stderr, "write failed:", err)
			os.Exit(1)
		} else if !ok {
			lost(fmt.Sprintf("the store refused token %d: a newer holder wrote", token), done)
		}
		time.Sleep(100 * time.Millisecond) // the pace of the work
	}
	conn.Close() // closing the connection releases the hold at once
	fmt.Println("released")
}
