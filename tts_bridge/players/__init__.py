"""Targets that play on Home Assistant media players: the audio's URL played with announce on
each player a target names, the announcement volume set and put back, and a lead-in of silence
for speakers that wake late. Door-neutral: a door hands over what it delivered."""
