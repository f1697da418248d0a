"""Where engines start (one launcher per kind), rendezvous, the registry of clusters and the reaper. Imports shared/, store/, errors."""
