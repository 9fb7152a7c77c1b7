// Command linearizability checks a lock history recorded by podlock's safety run with
// Porcupine, against a model of a reader-writer semaphore with fencing tokens (model.go).
//
//	linearizability -history history.json -html violation.html [-timeout 5m]
//
// It prints a JSON verdict: Porcupine's result for the whole history and for each lock (a
// partition of its own). When the result is not Ok it writes Porcupine's visualization of the
// longest linearizations to the -html path and names it in the verdict.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is what the command prints.
type Verdict struct {
	Result        string        `json:"result"`
	Locks         []LockVerdict `json:"locks"`
	Seconds       float64       `json:"seconds"`
	Visualization string        `json:"visualization,omitempty"`
}

// LockVerdict is Porcupine's result for one lock's history.
type LockVerdict struct {
	Lock   string `json:"lock"`
	Result string `json:"result"`
	Ops    int    `json:"ops"`
}

// operations turns ops into Porcupine's operations. An op without an answer returns after
// everything else: it may take effect at any time after its call, or never.
func operations(ops []Op) []porcupine.Operation {
	var last int64
	for _, op := range ops {
		last = max(last, op.Call, op.Return)
	}
	out := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		ret := op.Return
		if ret < 0 {
			ret = last + int64(time.Second)
		}
		out[i] = porcupine.Operation{ClientId: op.Row, Input: op, Call: op.Call, Output: op.Outcome, Return: ret}
	}
	return out
}

// check runs Porcupine over the history and names each partition's result: Ok where a
// partition has a linearization of all its operations, else the whole history's result.
func check(ops []Op, timeout time.Duration) (Verdict, porcupine.LinearizationInfo) {
	start := time.Now()
	history := operations(ops)
	m := model()
	result, info := porcupine.CheckOperationsVerbose(m, history, timeout)
	v := Verdict{Result: string(result), Seconds: time.Since(start).Seconds()}
	partials := info.PartialLinearizations()
	for i, part := range m.Partition(history) {
		lock := LockVerdict{Lock: part[0].Input.(Op).Lock, Result: string(result), Ops: len(part)}
		for _, p := range partials[i] {
			if len(p) == len(part) {
				lock.Result = string(porcupine.Ok)
			}
		}
		v.Locks = append(v.Locks, lock)
	}
	return v, info
}

func run(historyPath, htmlPath string, timeout time.Duration) error {
	data, err := os.ReadFile(historyPath)
	if err != nil {
		return err
	}
	var ops []Op
	if err := json.Unmarshal(data, &ops); err != nil {
		return fmt.Errorf("%s: %w", historyPath, err)
	}
	if len(ops) == 0 {
		return fmt.Errorf("%s: an empty history proves nothing", historyPath)
	}
	v, info := check(ops, timeout)
	if v.Result != string(porcupine.Ok) {
		if err := porcupine.VisualizePath(model(), info, htmlPath); err != nil {
			return err
		}
		v.Visualization = htmlPath
	}
	return json.NewEncoder(os.Stdout).Encode(v)
}

func main() {
	historyPath := flag.String("history", "", "the history, a JSON list of operations")
	htmlPath := flag.String("html", "linearizability.html", "where a violation's visualization goes")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up (verdict Unknown) after this long")
	flag.Parse()
	if err := run(*historyPath, *htmlPath, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "linearizability:", err)
		os.Exit(2)
	}
}
