/* Sum the integers on stdin: a submission with one bug per failing case. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void) {
    long long numbers[100]; /* Bug: a fixed-size buffer (wrong on long input). */
    long long x, all = 0, largest = 0;
    size_t count = 0, kept = 0;
    int zero = 0;
    while (scanf("%lld", &x) == 1) {
        if (kept < 100)
            numbers[kept++] = x;
        all += x;
        largest = x > largest ? x : largest;
        zero |= x == 0;
        count++;
    }
    /* Bug: a debug line that divides by the count (a crash on empty input). */
    fprintf(stderr, "mean %lld\n", all / (long long)count);
    if (largest >= 1LL << 40) /* Bug: a debug trace left in, one line per step. */
        for (long long step = 0; step < largest; step += 1000)
            printf("debug %lld\n", step);
    if (largest >= 100000000) { /* Bug: a table as large as the largest number. */
        long long *first = malloc((size_t)(largest + 1) * sizeof *first);
        if (first == NULL)
            return 3;
        for (long long v = 0; v <= largest; v++)
            first[v] = -1;
        for (size_t k = 0; k < kept; k++)
            if (numbers[k] >= 0 && first[numbers[k]] < 0)
                first[numbers[k]] = (long long)k;
        fprintf(stderr, "first %lld at %lld\n", largest, first[largest]);
        free(first);
    }
    if (zero)
        sleep(60); /* Bug: a pause left in from debugging. */
    long long total = 0;
    volatile size_t i = 0; /* volatile: the loop below need not end */
    while (i < kept) {
        if (numbers[i] < 0)
            continue; /* Bug: never steps past a negative number. */
        total += numbers[i];
        i++;
    }
    printf("%lld\n", total);
    return 0;
}
