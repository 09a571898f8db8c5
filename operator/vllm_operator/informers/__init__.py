"""What the operator reads: the watch-fed copies of servers, their children and pods."""
