"""The findings of a ``meta.pilot`` run (seed noise, paired differences, the signal-to-noise of one generation, the
horizon check) and their text."""
