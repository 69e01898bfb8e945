"""The spot-market simulator: one run's market and recovery strategy over real availability traces."""
