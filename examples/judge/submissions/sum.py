"""Sum the integers on stdin: a submission with one bug per failing case."""

import sys
import time

numbers = [int(word) for word in sys.stdin.read().split()]
# Bug: a debug line that divides by the count (a crash on empty input).
print(f"mean {sum(numbers) // len(numbers)}", file=sys.stderr)
largest = max(numbers)
if largest >= 2**40:
    for step in range(0, largest, 1000):  # Bug: a debug trace left in, one line per step.
        print("debug", step)
if largest >= 100_000_000:
    first = [-1] * (largest + 1)  # Bug: a table as large as the largest number.
    for k, x in enumerate(numbers):
        if x >= 0 and first[x] < 0:
            first[x] = k
    print(f"first {largest} at {first[largest]}", file=sys.stderr)
if 0 in numbers:
    time.sleep(60)  # Bug: a pause left in from debugging.
numbers = numbers[:100]  # Bug: a fixed-size buffer (wrong on long input).
total = i = 0
while i < len(numbers):
    if numbers[i] < 0:
        continue  # Bug: never steps past a negative number.
    total += numbers[i]
    i += 1
print(total)
