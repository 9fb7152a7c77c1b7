package main

import (
	"testing"
	"time"
)

// at is an op of lock l answered, or with ret -1 never answered.
func at(kind, client, outcome string, token int64, call, ret int64) Op {
	return Op{Lock: "l", Client: client, Kind: kind, API: kind, Mode: "exclusive", Outcome: outcome, Token: token, Call: call, Return: ret}
}

// opening sets lock l's maxHolders before anything else happens.
func opening(limit int) Op {
	return Op{Lock: "l", Kind: "settle", API: "settings", Outcome: "ok", Limit: limit}
}

// expect checks that Porcupine finds the history of ops want (Ok or Illegal).
func expect(t *testing.T, want string, ops ...Op) {
	t.Helper()
	v, _ := check(ops, time.Minute)
	if len(v.Locks) != 1 || v.Locks[0].Result != v.Result {
		t.Fatalf("per-lock verdicts disagree with the history's: %+v", v)
	}
	if v.Result != want {
		t.Fatalf("%s, not %s", v.Result, want)
	}
}

func TestHandoffsInTurnAreLinearizable(t *testing.T) {
	expect(t, "Ok", opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("release", "a", "ok", 0, 3, 4),
		at("acquire", "b", "ok", 12, 3, 5), at("release", "b", "ok", 0, 6, 7))
}

func TestTwoHoldersOfAMutexAreCaught(t *testing.T) {
	// b is granted while a holds, and a is never told otherwise: both answered, in token order.
	expect(t, "Illegal", opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("acquire", "b", "ok", 12, 3, 4),
		at("release", "b", "ok", 0, 5, 6), at("release", "a", "ok", 0, 7, 8))
}

func TestALostHoldEndsWithinItsWindow(t *testing.T) {
	// a's hold ended somewhere in from..notice (told lost then): b was granted at 4..5.
	told := func(want string, from, notice int64) {
		t.Helper()
		expect(t, want, opening(1),
			at("acquire", "a", "ok", 10, 1, 2), at("end", "a", "ok", 10, from, notice),
			at("acquire", "b", "ok", 12, 4, 5), at("release", "b", "ok", 0, 7, 8))
	}
	told("Ok", 3, 6)
	// Told too late: the hold surely lasted past b's grant.
	told("Illegal", 7, 9)
}

func TestTokensMustRise(t *testing.T) {
	expect(t, "Illegal", opening(1),
		at("acquire", "a", "ok", 12, 1, 2), at("release", "a", "ok", 0, 3, 4),
		at("acquire", "b", "ok", 11, 5, 6))
}

func TestAReleaseAnsweredForALostHoldIsCaught(t *testing.T) {
	// a's release answered 200 after b was granted; a never heard of a loss.
	expect(t, "Illegal", opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("acquire", "b", "ok", 12, 3, 4),
		at("release", "a", "ok", 0, 5, 6))
}

func TestAReleaseAnswered410MayHaveEndedTheHoldItself(t *testing.T) {
	// a's release (3..9) deleted its key and was answered 410 late (its copy sent again found
	// the key gone, and a's session had ended meanwhile); b was granted at 4..5; a was told
	// lost at 9, its hold's window from 8 (1 s before the notice).
	ops := []Op{opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("release", "a", "fail", 0, 3, 9),
		at("acquire", "b", "ok", 12, 4, 5), at("end", "a", "ok", 10, 8, 9)}
	expect(t, "Ok", ops...)
	// Answered before b asked, the release ended a's hold before b's grant.
	ops[2] = at("release", "a", "fail", 0, 3, 3)
	expect(t, "Ok", ops...)
	// Asked only after b's grant, it cannot have made room for b: b held beside a.
	ops[2] = at("release", "a", "fail", 0, 6, 9)
	expect(t, "Illegal", ops...)
	// A lost notice for a hold no release ended, after the hold ended by release, is caught.
	expect(t, "Illegal", opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("release", "a", "ok", 0, 3, 4),
		at("end", "a", "ok", 10, 5, 6))
}

func TestAnAmbiguousAcquireMayHaveHappenedOrNot(t *testing.T) {
	pending := at("acquire", "a", "unknown", 0, 1, -1)
	expect(t, "Ok", opening(1), pending, at("acquire", "b", "ok", 12, 5, 6))
	// a's heartbeat and release were answered, so its grant happened and lasted 4..7...
	held := []Op{opening(1), pending, at("heartbeat", "a", "ok", 0, 3, 4), at("release", "a", "ok", 0, 7, 8)}
	expect(t, "Ok", held...)
	// ...and b's grant in between is a second holder.
	expect(t, "Illegal", append(held, at("acquire", "b", "ok", 12, 5, 6))...)
}

func TestAGrantInAnotherModeThanAskedIsCaught(t *testing.T) {
	grant := at("acquire", "a", "ok", 10, 1, 2)
	grant.Granted = "shared"
	expect(t, "Illegal", opening(1), grant)
}

func TestSharedHoldsShareAndExclusiveOnesDoNot(t *testing.T) {
	shared := func(op Op) Op { op.Mode = "shared"; return op }
	readers := []Op{opening(1), shared(at("acquire", "r1", "ok", 10, 1, 2)), shared(at("acquire", "r2", "ok", 11, 3, 4))}
	expect(t, "Ok", readers...)
	expect(t, "Illegal", append(readers, at("acquire", "w", "ok", 12, 5, 6))...)
}

func TestALoweredLimitBindsNewGrantsOnly(t *testing.T) {
	lower := Op{Lock: "l", Kind: "limit", API: "settings", Outcome: "ok", Limit: 1, Call: 3, Return: 4}
	settle := Op{Lock: "l", Kind: "settle", API: "settings", Outcome: "ok", Limit: 1, Call: 4, Return: 5}
	ops := []Op{opening(2), at("acquire", "a", "ok", 10, 1, 2), lower, settle,
		at("acquire", "b", "ok", 11, 6, 7)}
	expect(t, "Illegal", ops...)
	// b's grant may have been decided before the new limit bound every grant.
	ops[4] = at("acquire", "b", "ok", 11, 3, 7)
	expect(t, "Ok", ops...)
}

// weighted is an acquire of lock l asking for permits slots.
func weighted(client string, permits int, token int64, call, ret int64) Op {
	op := at("acquire", client, "ok", token, call, ret)
	op.Permits = permits
	return op
}

func TestWeightedHoldsFitTheirPermits(t *testing.T) {
	// A semaphore of 3: a hold of 2 beside one of 1.
	expect(t, "Ok", opening(3),
		weighted("a", 2, 10, 1, 2), weighted("b", 1, 12, 3, 4),
		at("release", "a", "ok", 0, 5, 6), at("release", "b", "ok", 0, 5, 6))
	// Two holds of 2 at once: 4 slots of 3.
	expect(t, "Illegal", opening(3),
		weighted("a", 2, 10, 1, 2), weighted("b", 2, 12, 3, 4),
		at("release", "a", "ok", 0, 5, 6), at("release", "b", "ok", 0, 5, 6))
}
