"""The speech core every door uses: the pipeline (validate, route, queue, render), synthesis,
the sentence cache, scheduling, tier routing, idle work and run-time preferences. No door's
protocol is known here."""
