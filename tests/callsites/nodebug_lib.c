/* A library built without -g whose function calls back into the program:
 * its frame, between two of the program's, has no line information.
 * Not a tail call (the count after the call), so the frame stays. */
volatile int nodebug_calls;

void nodebug_call(void (*fn)(void))
{
    fn();
    nodebug_calls++;
}
