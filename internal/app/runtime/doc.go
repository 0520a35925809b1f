// Package runtime runs a cairn job, or the part of one a process is
// assigned: it compiles the stages' modules, restores state (whole, online
// or rescaled; from the local copy, a standby's cache or the store), starts
// one engine per sub-topology joined by repartition streams, commits each
// sub-topology's checkpoints and the job graph's graph checkpoints, applies
// the restore budget, drives an online restore's background download, and
// serves the dashboard, /metrics and the control actions.
//
// Its face is small:
//
//   - Start runs a job (Options.Assignment: the parts this process runs;
//     nil, the whole job) and returns a Running; Running.Run processes until
//     its context ends, then takes the final checkpoint; Close releases it.
//   - NewPlan cuts a job into its sub-topologies; Plan.StartSub runs one of
//     them alone (cairn test kills and restores each on its own).
//   - ServeHTTP serves a Running's dashboard, stats and actions (savepoint,
//     checkpoint, stop) on a listener.
//
// The command line, the demo, the drill, cairn test and the end-to-end
// tests all start jobs here; the engine, recovery and checkpoint packages
// below it decide, and know nothing of the job file.
package runtime
