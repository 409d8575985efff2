"""Tables, intervals and plots of the comparisons: :mod:`.stats` (paired intervals over seeds or
problems) and :mod:`.tables` (the tapo and tor summaries, reward curves)."""
