"""Sum the integers on stdin: a submission with one bug per failing case."""

import sys
import time

numbers = [int(word) for word in sys.stdin.read().split()]
# Bug: a debug line that divides by the count (crash on empty input).
print(f"mean {sum(numbers) / len(numbers):.2f}", file=sys.stderr)
if max(numbers) > 2**31:
    # Bug: a debug trace left in, one line per step up to the largest number.
    for step in range(0, max(numbers), 1000):
        print("debug", step)
if 0 in numbers:
    time.sleep(60)  # Bug: a pause left in from debugging (a timeout by the wall clock).
numbers = numbers[:100]  # Bug: a fixed-size buffer (wrong on long input).
total = i = 0
while i < len(numbers):
    if numbers[i] < 0:
        continue  # Bug: never steps past a negative number (a timeout by CPU time).
    total += numbers[i]
    i += 1
print(total)
