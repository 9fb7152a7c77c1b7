package main

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Op is one operation of a history as the safety run records it: what a client asked of a
// lock, when (nanoseconds of one monotonic clock), and what it was answered.
type Op struct {
	// Lock is the lock's name: the history is partitioned by it.
	Lock string `json:"lock"`
	// Client is the holder identity: a sidecar's pod and holder id. Two workers naming the same
	// holder id on one sidecar are one client, as the contract says.
	Client string `json:"client"`
	// Row is the visualization's row: the worker, or a row of its own for ends and settings.
	Row int `json:"row"`
	// Kind is acquire, release, heartbeat, end (a hold ended otherwise than by release, as its
	// client was told), limit (a change of maxHolders begins) or settle (it binds every grant).
	Kind string `json:"kind"`
	// API is how the client asked (acquire, hold, lock-cmd, release, close, heartbeat, ...).
	API string `json:"api"`
	// Mode is exclusive or shared, as an acquire asked for it.
	Mode string `json:"mode,omitempty"`
	// Granted is the mode a grant states (empty: the grant states none).
	Granted string `json:"granted,omitempty"`
	// Permits is how many of the lock's slots an acquire asks for (0: one, as before weighted
	// permits).
	Permits int `json:"permits,omitempty"`
	// Outcome is ok, fail (a definite refusal: the client does not hold) or unknown (no answer).
	Outcome string `json:"outcome"`
	// Token is the fencing token of a grant or of the hold that ended (0: not known).
	Token int64 `json:"token,omitempty"`
	// Limit is the maxHolders a limit or settle operation sets.
	Limit int `json:"limit,omitempty"`
	// Call and Return are the invocation and the answer; Return is -1 when no answer came.
	Call   int64 `json:"call"`
	Return int64 `json:"return"`
}

// holder is one hold the lock grants: its client, token (0 while unknown: the grant of an
// acquire whose answer was lost), mode and the slots it takes.
type holder struct {
	client  string
	token   int64
	mode    string
	permits int
}

// weight is how many slots an acquire asks for: its permits, one if it names none.
func (op Op) weight() int {
	return max(op.Permits, 1)
}

// lockState is a lock's state in the model: its holders (sorted by client), the maxHolders in
// force, the one being changed to (0: none), the highest token granted, and the holds that a
// release answered 410 may have ended itself (sorted), whose clients may still be told `lost`.
type lockState struct {
	holders []holder
	limit   int
	pending int
	highest int64
	closed  []holder
}

func (s lockState) find(client string) (holder, bool) {
	for _, h := range s.holders {
		if h.client == client {
			return h, true
		}
	}
	return holder{}, false
}

// with is s plus (or with a replaced) holder h.
func (s lockState) with(h holder) lockState {
	next := s.without(h.client)
	next.holders = append(next.holders, h)
	sort.Slice(next.holders, func(i, j int) bool { return next.holders[i].client < next.holders[j].client })
	if h.token > next.highest {
		next.highest = h.token
	}
	return next
}

// without is s less client's hold; the holder list is copied, states are never changed.
func (s lockState) without(client string) lockState {
	next := s
	next.holders = make([]holder, 0, len(s.holders)+1)
	for _, h := range s.holders {
		if h.client != client {
			next.holders = append(next.holders, h)
		}
	}
	return next
}

// closing is s less client's hold h, ended by a release that answered 410: the release's
// first copy may have deleted the key and the copy sent again found it gone (api.md: the
// cautious answer). Its client may still be told `lost` for it.
func (s lockState) closing(h holder) lockState {
	next := s.without(h.client)
	next.closed = append(append([]holder{}, s.closed...), h)
	sort.Slice(next.closed, func(i, j int) bool {
		a, b := next.closed[i], next.closed[j]
		return a.client < b.client || (a.client == b.client && a.token < b.token)
	})
	return next
}

// told is s after client's `lost` notice for token, of a hold a 410 release ended; false if
// no such hold is on record.
func (s lockState) told(client string, token int64) (lockState, bool) {
	for i, h := range s.closed {
		if h.client == client && (h.token == token || h.token == 0 || token == 0) {
			next := s
			next.closed = append(append([]holder{}, s.closed[:i]...), s.closed[i+1:]...)
			return next, true
		}
	}
	return s, false
}

// admits says whether a new hold in mode taking permits slots may be granted now: shared holds
// only beside shared ones, however many; exclusive ones only beside exclusive ones, while
// their permits and its own fit in maxHolders (with maxHolders 1, a reader-writer lock).
// While maxHolders changes, grants already decided under the old value may still land, so the
// larger of the two binds.
func (s lockState) admits(mode string, permits int) bool {
	taken := 0
	for _, h := range s.holders {
		if h.mode != mode {
			return false
		}
		taken += h.permits
	}
	return mode == "shared" || taken+permits <= max(s.limit, s.pending)
}

// acquire steps an acquire (or a hold, or `podlock lock`): the states it may leave.
func acquire(s lockState, op Op) []lockState {
	held, holds := s.find(op.Client)
	if op.Granted != "" && op.Granted != op.Mode {
		return nil // a grant is never in another mode than asked
	}
	switch op.Outcome {
	case "fail":
		return []lockState{s}
	case "unknown":
		next := []lockState{s}
		if !holds && s.admits(op.Mode, op.weight()) {
			next = append(next, s.with(holder{op.Client, 0, op.Mode, op.weight()}))
		}
		return next
	}
	if holds {
		// Acquiring again with a holder id that holds answers the same grant, in its mode
		// and with its permits.
		same := held.mode == op.Mode && held.permits == op.weight()
		if same && (held.token == op.Token || held.token == 0) {
			return []lockState{s.with(holder{op.Client, op.Token, op.Mode, op.weight()})}
		}
		return nil
	}
	if s.admits(op.Mode, op.weight()) && op.Token > s.highest {
		return []lockState{s.with(holder{op.Client, op.Token, op.Mode, op.weight()})}
	}
	return nil
}

// end steps a release, a heartbeat or a hold's end.
func end(s lockState, op Op) []lockState {
	held, holds := s.find(op.Client)
	switch {
	case op.Kind == "end" && holds && (op.Token == 0 || held.token == 0 || held.token == op.Token):
		return []lockState{s.without(op.Client)}
	case op.Kind == "end":
		if next, ok := s.told(op.Client, op.Token); ok {
			return []lockState{next}
		}
		return nil
	case op.Outcome == "fail" && op.Kind == "release" && holds:
		return []lockState{s.closing(held)} // 410 lock_lost, for a release that may have ended it
	case op.Outcome == "unknown" && op.Kind == "release" && holds:
		return []lockState{s, s.without(op.Client)}
	case op.Outcome == "unknown":
		return []lockState{s}
	case op.Outcome == "fail" && !holds:
		return []lockState{s} // 409 not_holder, 410 lock_lost: the hold was gone
	case op.Outcome == "ok" && holds && op.Kind == "release":
		return []lockState{s.without(op.Client)}
	case op.Outcome == "ok" && holds:
		return []lockState{s} // a heartbeat answered: the hold lasts
	}
	return nil
}

// step is the model's step: every state the operation may leave s in (none: illegal).
func step(state, input, _ interface{}) []interface{} {
	s, op := state.(lockState), input.(Op)
	var next []lockState
	switch op.Kind {
	case "acquire":
		next = acquire(s, op)
	case "release", "heartbeat", "end":
		next = end(s, op)
	case "limit":
		s.pending = op.Limit
		next = []lockState{s}
	case "settle":
		s.limit, s.pending = op.Limit, 0
		next = []lockState{s}
	}
	out := make([]interface{}, len(next))
	for i, n := range next {
		out[i] = n
	}
	return out
}

func equal(a, b interface{}) bool {
	x, y := a.(lockState), b.(lockState)
	if x.limit != y.limit || x.pending != y.pending || x.highest != y.highest {
		return false
	}
	return sameHolders(x.holders, y.holders) && sameHolders(x.closed, y.closed)
}

func sameHolders(a, b []holder) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func describe(state interface{}) string {
	s := state.(lockState)
	var hs []string
	for _, h := range s.holders {
		hs = append(hs, fmt.Sprintf("%s:%d:%s:%d", h.client, h.token, h.mode, h.permits))
	}
	limit := fmt.Sprint(s.limit)
	if s.pending != 0 {
		limit += fmt.Sprintf("->%d", s.pending)
	}
	var closed []string
	for _, h := range s.closed {
		closed = append(closed, fmt.Sprintf("%s:%d", h.client, h.token))
	}
	return fmt.Sprintf("max %s, top %d, [%s], ended by a 410 release [%s]", limit, s.highest,
		strings.Join(hs, " "), strings.Join(closed, " "))
}

func hash(state interface{}) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(describe(state)))
	return h.Sum64()
}

func describeOp(input, _ interface{}) string {
	op := input.(Op)
	switch op.Kind {
	case "limit", "settle":
		return fmt.Sprintf("%s maxHolders %d", op.Kind, op.Limit)
	case "acquire":
		return fmt.Sprintf("%s %s %s x%d -> %s %d", op.API, op.Client, op.Mode, op.weight(), op.Outcome, op.Token)
	}
	return fmt.Sprintf("%s %s %d -> %s", op.API, op.Client, op.Token, op.Outcome)
}

// partition splits a history by lock, in the order of the lock names.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byLock := map[string][]porcupine.Operation{}
	for _, op := range history {
		lock := op.Input.(Op).Lock
		byLock[lock] = append(byLock[lock], op)
	}
	var out [][]porcupine.Operation
	for _, lock := range sortedKeys(byLock) {
		out = append(out, byLock[lock])
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// model is the reader-writer semaphore with fencing. Ops without an answer may have taken
// effect or not (nondeterminism). Init knows no lock: each lock's history opens with a settle
// op, answered before anything else was asked, that sets its maxHolders.
func model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init: func() []interface{} {
			return []interface{}{lockState{limit: 1}}
		},
		Step:              step,
		Equal:             equal,
		Hash:              hash,
		DescribeOperation: describeOp,
		DescribeState:     describe,
	}
	return nm.ToModel()
}
