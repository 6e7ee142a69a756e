"""Rank 2 sleeps instead of joining; the others join with shoal.init() (its join timeout from
SHOAL_INIT_TIMEOUT) and must say which rank never arrived.

Usage: late_rank.py
"""

import os
import time

if os.environ["RANK"] == "2":
    time.sleep(300)  # stopped by the launcher once another rank has failed

import shoal

shoal.init()
