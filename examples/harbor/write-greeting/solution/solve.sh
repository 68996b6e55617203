#!/bin/bash
echo "hello, harbor" > /app/out/greeting.txt
