"""What training and evaluation share about the labelled rows: the class of a row's answer and the weights
that even the classes out (`answers.py`), the reward of an answer read off the row's hindsight value
table (`rewards.py`), and the statistics of binary decisions with their bootstrap intervals
(`metrics.py`). GRPO trains on these rewards and weights; `rir eval-controller` reports the same
rewards and statistics; calibration fits the review threshold with them. Train and eval never import
each other: what both need lives here, below them.
"""
