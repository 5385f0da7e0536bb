/* Sum the integers on stdin: a correct submission. */
#include <stdio.h>

int main(void) {
    long long total = 0, n;
    while (scanf("%lld", &n) == 1)
        total += n;
    printf("%lld\n", total);
    return 0;
}
