//! The liveness check. Stateright's `eventually` properties are judged on acyclic paths only
//! (a path that closes a cycle, or joins a state already seen, is not checked), and it has no
//! notion of fairness, so they cannot say "a waiter is eventually let in". Instead this
//! explores the whole state graph of the same [`Model`] and checks, for each property and
//! client, that from every reachable state where the premise holds a state where the goal
//! holds is reachable by good steps alone ([`Action::good`](crate::model::Action::good)), however many faults came before
//! (CTL `AG (premise -> EF goal)`). In a finite graph that is liveness under strong fairness:
//! a run that keeps taking good steps, each step that is enabled infinitely often taken
//! infinitely often, reaches the goal.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use stateright::Model;

use crate::model::{Protocol, Steps};
use crate::props::{Liveness, liveness};
use crate::state::State;

/// What the liveness check explored and found.
pub struct Outcome {
    /// Unique states.
    pub states: usize,
    /// Good steps between them.
    pub good_edges: usize,
    /// A counterexample per property that fails: its name, the client, and a path from the
    /// start to a state from which its goal cannot be reached.
    pub failures: Vec<(&'static str, u8, Steps)>,
}

/// The explored graph: per state, its parent step and the premise and goal bits that hold
/// there (bit `property * clients + client`); and the good steps, reversed, each with whether
/// it is a holder leaving.
struct Graph {
    parent: Vec<(u32, u32)>,
    premise: Vec<u64>,
    goal: Vec<u64>,
    reverse: Vec<(u32, u32, bool)>,
}

/// Checks `model`'s liveness properties.
pub fn check(model: &Protocol) -> Outcome {
    let props = liveness();
    let graph = explore(model, &props);
    let can = [reachable_goals(&graph, false), reachable_goals(&graph, true)];
    let clients = model.spec.clients.len();
    let mut failures = vec![];
    for bit in 0..props.len() * clients {
        let can = &can[usize::from(props[bit / clients].leaving)];
        let stuck = (0..can.len()).find(|&s| graph.premise[s] & !can[s] & (1 << bit) != 0);
        if let Some(s) = stuck {
            let (name, client) = (props[bit / clients].name, (bit % clients) as u8);
            failures.push((name, client, path(model, &graph, s)));
        }
    }
    Outcome {
        states: graph.parent.len(),
        good_edges: graph.reverse.len(),
        failures,
    }
}

fn fingerprint(state: &State) -> u64 {
    let mut h = DefaultHasher::new();
    state.hash(&mut h);
    h.finish()
}

/// The premise and goal bits of `state`. A state where a safety property already failed ends
/// its path (the model offers no step from it): it counts as reaching every goal, so that
/// liveness is judged on the runs that stay safe.
fn bits(model: &Protocol, props: &[Liveness], state: &State) -> (u64, u64) {
    let clients = model.spec.clients.len();
    let (mut premise, mut goal) = (0, 0);
    if state.broken.is_some() {
        return (premise, u64::MAX);
    }
    for (p, prop) in props.iter().enumerate() {
        for c in 0..clients {
            let bit = 1u64 << (p * clients + c);
            if (prop.premise)(model, state, c as u8) {
                premise |= bit;
            }
            if (prop.goal)(model, state, c as u8) {
                goal |= bit;
            }
        }
    }
    (premise, goal)
}

/// Breadth-first over every reachable state (states are identified by a 64-bit hash).
fn explore(model: &Protocol, props: &[Liveness]) -> Graph {
    assert!(
        props.len() * model.spec.clients.len() <= 64,
        "one bit per property and client"
    );
    let mut seen = Seen {
        ids: HashMap::new(),
        queue: VecDeque::new(),
        graph: Graph {
            parent: vec![],
            premise: vec![],
            goal: vec![],
            reverse: vec![],
        },
    };
    for init in model.init_states() {
        seen.add(model, props, init, (u32::MAX, 0));
    }
    let mut actions = vec![];
    while let Some((id, state)) = seen.queue.pop_front() {
        model.actions(&state, &mut actions);
        for (i, action) in actions.drain(..).enumerate() {
            let (good, leaves) = (action.good(), action.leaves());
            let next = model.next_state(&state, action).expect("every action steps");
            let to = seen.add(model, props, next, (id, i as u32));
            if good {
                seen.graph.reverse.push((to, id, leaves));
            }
        }
    }
    seen.graph
}

/// The exploration's bookkeeping: the states seen, those yet to expand, and the graph.
struct Seen {
    ids: HashMap<u64, u32>,
    queue: VecDeque<(u32, State)>,
    graph: Graph,
}

impl Seen {
    /// The id of `state`, reached from `parent` (state id, action index), added if new.
    fn add(&mut self, model: &Protocol, props: &[Liveness], state: State, parent: (u32, u32)) -> u32 {
        match self.ids.entry(fingerprint(&state)) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let id = self.graph.parent.len() as u32;
                let (premise, goal) = bits(model, props, &state);
                self.graph.parent.push(parent);
                self.graph.premise.push(premise);
                self.graph.goal.push(goal);
                e.insert(id);
                self.queue.push_back((id, state));
                id
            }
        }
    }
}

/// Per state, the goal bits reachable from it by good steps (`leaving`: releases included): a
/// fixpoint over the reversed steps, each state's bits growing until nothing changes.
fn reachable_goals(graph: &Graph, leaving: bool) -> Vec<u64> {
    let mut reverse: Vec<_> = (graph.reverse.iter())
        .filter(|e| leaving || !e.2)
        .map(|&(to, from, _)| (to, from))
        .collect();
    reverse.sort_unstable();
    let mut start = vec![0usize; graph.goal.len() + 1];
    for &(to, _) in &reverse {
        start[to as usize + 1] += 1;
    }
    for i in 0..graph.goal.len() {
        start[i + 1] += start[i];
    }
    let mut can = graph.goal.clone();
    let mut work: Vec<u32> = (0..can.len() as u32).filter(|&s| can[s as usize] != 0).collect();
    while let Some(to) = work.pop() {
        let bits = can[to as usize];
        for &(_, from) in &reverse[start[to as usize]..start[to as usize + 1]] {
            let was = can[from as usize];
            if was | bits != was {
                can[from as usize] = was | bits;
                work.push(from);
            }
        }
    }
    can
}

/// The steps from the start to state `id`, replayed on the model.
fn path(model: &Protocol, graph: &Graph, id: usize) -> Steps {
    let mut indices = vec![];
    let mut at = id as u32;
    while graph.parent[at as usize].0 != u32::MAX {
        let (parent, i) = graph.parent[at as usize];
        indices.push(i as usize);
        at = parent;
    }
    let mut state = model.init_states().remove(0);
    let mut steps = vec![];
    for i in indices.into_iter().rev() {
        let mut actions = vec![];
        model.actions(&state, &mut actions);
        let action = actions[i];
        state = model.next_state(&state, action).expect("every action steps");
        steps.push((action, state.clone()));
    }
    steps
}
