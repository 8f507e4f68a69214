// Package transcript holds holdfast's golden transcripts: small scripts of
// session, KV, lock and catalog steps, run against an in-process server
// (internal/servertest) whose clock is fake, with the expected output of
// each step written under it. The package has no code of its own; its tests
// are the runner, and testdata/*.txt are the transcripts. A change of
// protocol behaviour shows up as a diff of a transcript in review.
//
// # File format
//
// A transcript is a sequence of blocks. Lines starting with '#' and blank
// lines between blocks are comments. A block is one or more command lines,
// a line "----", and the output of those commands, one or more lines, up to
// the next blank line or the end of the file:
//
//	session create name=a ttl=15s -> $a
//	----
//	$a: name=a node=node1 behavior=release ttl=15s lock-delay=15s checks=serfHealth create=5
//
// Lines of a command section that start with white space continue the
// command above them (the operations of a txn). Running the tests with
// -update rewrites every file with the output actually seen:
//
//	go test ./internal/transcript -update
//
// # Commands
//
// Arguments are words separated by spaces; a double-quoted word is read as a
// Go string and is always positional. A word NAME=VALUE is an option. $x
// stands for the ID of the session bound to $x by "-> $x"; in the output,
// every known session ID is written back as its $name, so transcripts do not
// depend on random IDs. Indexes are raft indexes, printed as they are: the
// server starts from the same log every time, and nothing but the script
// writes to it, so they are stable.
//
//	session create [name=N] [node=N] [ttl=D] [lock-delay=D] [behavior=release|delete] [checks=a,b|none] [-> $x]
//	session info $x | session list | session renew $x | session destroy $x
//	kv put KEY [VALUE] [flags=N] [cas=N]
//	kv acquire KEY $x [VALUE] [flags=N]
//	kv release KEY $x [VALUE] [lock-index=N]
//	kv get KEY | kv list PREFIX | kv delete KEY [cas=N] | kv delete-tree PREFIX
//	fence KEY $x LOCKINDEX
//	txn            (then one indented operation per line:)
//	    set KEY [VALUE] | cas KEY VALUE index=N | lock KEY $x [VALUE] | unlock KEY $x [lock-index=N]
//	    get KEY | get-tree PREFIX | check-index KEY index=N | check-session KEY $x
//	    check-not-exists KEY | check-lock KEY $x lock-index=N
//	    delete KEY | delete-cas KEY index=N | delete-tree PREFIX
//	catalog register node=N [address=A] [check=ID] [status=S] | catalog deregister node=N [check=ID]
//	advance DURATION       moves the fake clock (and fires due timers)
//	wait session-gone $x   waits, with blocking queries, until $x is invalidated
//
// A session that expires when the clock moves is invalidated through raft,
// asynchronously: a script must "wait session-gone" before it looks at what
// the invalidation changed. The wait uses blocking queries, never sleeps,
// and gives up after a few seconds of real time.
package transcript
