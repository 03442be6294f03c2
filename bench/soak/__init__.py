"""The soak (`bench soak`): chaos traffic against the served model for a while, then proof that
nothing broke. Nothing is imported here."""
