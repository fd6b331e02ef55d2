"""After a run: the run record (run.json), the ledger of every run (SQLite), and an instance's
running intervals across stops and starts, from which its bill is settled."""
