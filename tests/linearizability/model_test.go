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

func verdict(t *testing.T, ops ...Op) string {
	t.Helper()
	v, _ := check(ops, time.Minute)
	if len(v.Locks) != 1 || v.Locks[0].Result != v.Result {
		t.Fatalf("per-lock verdicts disagree with the history's: %+v", v)
	}
	return v.Result
}

func TestHandoffsInTurnAreLinearizable(t *testing.T) {
	got := verdict(t, opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("release", "a", "ok", 0, 3, 4),
		at("acquire", "b", "ok", 12, 3, 5), at("release", "b", "ok", 0, 6, 7))
	if got != "Ok" {
		t.Fatal(got)
	}
}

func TestTwoHoldersOfAMutexAreCaught(t *testing.T) {
	// b is granted while a holds, and a is never told otherwise: both answered, in token order.
	got := verdict(t, opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("acquire", "b", "ok", 12, 3, 4),
		at("release", "b", "ok", 0, 5, 6), at("release", "a", "ok", 0, 7, 8))
	if got != "Illegal" {
		t.Fatal(got)
	}
}

func TestALostHoldEndsWithinItsWindow(t *testing.T) {
	// a's hold ended somewhere in 3..6 (told lost at 6): b's grant at 4..5 fits after it.
	told := func(from, notice int64) string {
		return verdict(t, opening(1),
			at("acquire", "a", "ok", 10, 1, 2), at("end", "a", "ok", 10, from, notice),
			at("acquire", "b", "ok", 12, 4, 5), at("release", "b", "ok", 0, 7, 8))
	}
	if got := told(3, 6); got != "Ok" {
		t.Fatal(got)
	}
	// Told too late: the hold surely lasted past b's grant.
	if got := told(7, 9); got != "Illegal" {
		t.Fatal(got)
	}
}

func TestTokensMustRise(t *testing.T) {
	got := verdict(t, opening(1),
		at("acquire", "a", "ok", 12, 1, 2), at("release", "a", "ok", 0, 3, 4),
		at("acquire", "b", "ok", 11, 5, 6))
	if got != "Illegal" {
		t.Fatal(got)
	}
}

func TestAReleaseAnsweredForALostHoldIsCaught(t *testing.T) {
	// a's release answered 200 after b was granted; a never heard of a loss.
	got := verdict(t, opening(1),
		at("acquire", "a", "ok", 10, 1, 2), at("acquire", "b", "ok", 12, 3, 4),
		at("release", "a", "ok", 0, 5, 6))
	if got != "Illegal" {
		t.Fatal(got)
	}
}

func TestAnAmbiguousAcquireMayHaveHappenedOrNot(t *testing.T) {
	// a's acquire got no answer; its release answered 200, so the grant happened: b's grant
	// in between is then a second holder.
	pending := at("acquire", "a", "unknown", 0, 1, -1)
	if got := verdict(t, opening(1), pending, at("acquire", "b", "ok", 12, 5, 6)); got != "Ok" {
		t.Fatal(got)
	}
	got := verdict(t, opening(1), pending, at("release", "a", "ok", 0, 3, 4), at("acquire", "b", "ok", 12, 5, 6),
		at("release", "a", "ok", 0, 7, 8))
	if got != "Illegal" {
		t.Fatal(got)
	}
}

func TestSharedHoldsShareAndExclusiveOnesDoNot(t *testing.T) {
	shared := func(op Op) Op { op.Mode = "shared"; return op }
	readers := []Op{opening(1), shared(at("acquire", "r1", "ok", 10, 1, 2)), shared(at("acquire", "r2", "ok", 11, 3, 4))}
	if got := verdict(t, readers...); got != "Ok" {
		t.Fatal(got)
	}
	if got := verdict(t, append(readers, at("acquire", "w", "ok", 12, 5, 6))...); got != "Illegal" {
		t.Fatal(got)
	}
}

func TestALoweredLimitBindsNewGrantsOnly(t *testing.T) {
	lower := Op{Lock: "l", Kind: "limit", API: "settings", Outcome: "ok", Limit: 1, Call: 3, Return: 4}
	settle := Op{Lock: "l", Kind: "settle", API: "settings", Outcome: "ok", Limit: 1, Call: 4, Return: 5}
	ops := []Op{opening(2), at("acquire", "a", "ok", 10, 1, 2), lower, settle,
		at("acquire", "b", "ok", 11, 6, 7)}
	if got := verdict(t, ops...); got != "Illegal" {
		t.Fatal(got)
	}
	// b's grant may have been decided before the new limit bound every grant.
	ops[4] = at("acquire", "b", "ok", 11, 3, 7)
	if got := verdict(t, ops...); got != "Ok" {
		t.Fatal(got)
	}
}
