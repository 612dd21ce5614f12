pub use llama_cpp_sys_2 as sys;
